# gnuplot -e "dir='DIR'" plot.gp: one panel per run of tests/ublk_handoff.rs, from the
# *-timeline.csv files it writes (largest fio completion latency per 100 ms; shaded: a
# hand-off under way, from its request until the successor answered).
set terminal pngcairo size 1400,900 font ",10"
set output dir.'/handoff-timeline.png'
set datafile separator ','
set multiplot layout 3,1 title 'fio completion latency across repeated hand-offs (VM, TCG, kernel 7.3.4; largest per 100 ms)'
set ylabel 'max completion latency (ms)'
set yrange [0:1400]
set xrange [0:*]
set grid y
set key top right opaque
set boxwidth 0.1 absolute
set style fill solid 0.2 noborder
do for [run in 'zero-copy-plain user-copy-plain zero-copy-fua-deferred'] {
  set title run
  set xlabel 'seconds since fio started'
  plot dir.'/'.run.'-timeline.csv' every ::1 using 1:($3*1400) with boxes lc rgb '#4477aa' title 'hand-off under way', \
       '' every ::1 using 1:2 with lines lw 1.2 lc rgb '#cc3311' title 'largest completion latency'
}
unset multiplot
