#!/bin/bash
# Native engine benches on the lent machine. Each bench bounded by timeout; JSON into $OUT.
cd "$(dirname "$0")"
O=${OUT:-/tmp/out}; mkdir -p "$O"
{ date -u; uname -a; nproc; free -g; lscpu | grep -E 'Model name|^CPU\(s\)|MHz'; df -h /tmp; modprobe ublk_drv 2>&1; ls -l /dev/ublk-control 2>&1; } > "$O/machine.txt" 2>&1
t() { local name=$1 lim=$2; shift 2; local s=$(date +%s.%N); timeout "$lim" "$@" > "$O/$name.stdout" 2> "$O/$name.stderr"; echo "$name rc=$? wall=$(echo "$(date +%s.%N) - $s" | bc)" | tee -a "$O/summary.txt"; }
t flush_cpu 110 ./flush_cpu --size-mib 512 --rounds 3 --json "$O/flush_cpu.json"
t flush_cpu_s3 110 ./flush_cpu --s3 --size-mib 256 --rounds 3 --json "$O/flush_cpu_s3.json"
t readahead 60 ./readahead --size-mib 64 --rounds 3 --json "$O/readahead.json"
t store 60 ./store --size-mib 128 --rounds 3 --json "$O/store.json"
t objstore_encryption 40 ./objstore_encryption --rounds 9
t volume_encryption 40 ./volume_encryption --rounds 3
t scale_rss 40 ./scale rss --json "$O/scale_rss.json"
echo done | tee -a "$O/summary.txt"
