#!/usr/bin/env bash
# Per-thread CPU of a glidefs daemon during hot 4k randread, QD32, 1 and 4 jobs (and null).
set -euo pipefail
out=$1
bin=$PWD/target/release
work=$(mktemp -d /tmp/exp.XXXX)
modprobe brd rd_nr=1 rd_size=$((1024 * 1024))
mkfs.xfs -q -f /dev/ram0
mkdir -p "$work/fs" && mount /dev/ram0 "$work/fs"
cat >"$work/g.toml" <<EOF
data_dir = "$work/fs/data"
[store]
url = "file://$work/fs/store"
[api]
socket = "$work/api.sock"
[volume_defaults]
block_size = "128K"
queues = 2
queue_depth = 64
max_io_bytes = "512K"
flush_threshold_bytes = "1T"
flush_interval_secs = 864000
[log]
filter = "info"
EOF
"$bin/glidefs" serve --config "$work/g.toml" >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do [ -S "$work/api.sock" ] && break; sleep 0.1; done
sleep 1
g() { "$bin/glidefs" volume --socket "$work/api.sock" "$@"; }
g create hot --size 64M >/dev/null
dev=$(g show hot --json | sed -n 's/^ *"path": *"\([^"]*\)".*/\1/p' | head -1)
echo "device $dev" | tee -a "$out/result.txt"
fio --name=fill --filename="$dev" --direct=1 --ioengine=io_uring --rw=write --bs=1M --iodepth=8 --size=64M --output=/dev/null
g flush hot >/dev/null
"$bin/examples/ublk-target" null --size $((64 << 20)) --queues 2 --depth 64 >"$work/null.out" 2>&1 &
npid=$!
for _ in $(seq 1 300); do grep -q '^ready' "$work/null.out" 2>/dev/null && break; sleep 0.1; done
ndev=$(awk '/^ready/{print $2}' "$work/null.out")
snap() { # pid -> "tid comm ticks" lines
	for t in /proc/$1/task/*; do
		printf '%s %s %s\n' "${t##*/}" "$(tr ' ' _ <"$t/comm")" "$(sed 's/^.*) //' "$t/stat" | awk '{print $12 "/" $13}')"
	done
}
run() { # label pid dev nj
	local label=$1 p=$2 d=$3 nj=$4
	snap "$p" >"$work/a"
	local cs0 cs1
	cs0=$(awk '/^ctxt/{print $2}' /proc/stat)
	fio --name=rr --filename="$d" --direct=1 --ioengine=io_uring --rw=randread --bs=4k --iodepth=32 \
		--numjobs="$nj" --size=$((64 / nj))M --offset_increment=$((64 / nj))M --group_reporting \
		--time_based --runtime=4 --norandommap --randrepeat=0 --output-format=json --output="$work/fio.json"
	cs1=$(awk '/^ctxt/{print $2}' /proc/stat)
	snap "$p" >"$work/b"
	local iops
	iops=$(python3 -c "import json;print(round(json.load(open('$work/fio.json'))['jobs'][0]['read']['iops']))")
	{
		echo "== $label nj=$nj iops=$iops ctxsw/s=$(((cs1 - cs0) / 4)) threads=$(ls /proc/$p/task | wc -l)"
		join <(sort "$work/a") <(sort "$work/b") | awk '{split($3,a,"/"); split($5,b,"/"); u=b[1]-a[1]; s=b[2]-a[2]; if (u+s>0) {U[$2]+=u; S[$2]+=s; c[$2]++}} END {for (k in U) printf "  %-24s %5d ticks: user %d sys %d (%d threads)\n", k, U[k]+S[k], U[k], S[k], c[k]}' | sort -k2 -nr
		awk 'NR==FNR{a[$1]=1;next} !($1 in a){print "  new thread: " $2}' "$work/a" "$work/b" | sort | uniq -c
	} | tee -a "$out/result.txt"
}
for r in 1 2 3; do
	run glidefs "$pid" "$dev" 4
	run null "$npid" "$ndev" 4
done
kill "$npid" || true
g rm hot >/dev/null || true
kill "$pid" || true
wait || true
