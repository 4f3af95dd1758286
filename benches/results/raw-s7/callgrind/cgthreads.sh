#!/bin/bash
# usage: cgthreads.sh OUTNAME BINARY [env...]; per-thread totals (separate threads)
out=$1; bin=$2; shift 2
env "$@" valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file=/tmp/perf-cg/$out.cg "$bin" > /tmp/perf-cg/$out.log 2>&1
for f in /tmp/perf-cg/$out.cg-*; do echo "$out $(basename $f) $(grep -E '^(summary|totals):' $f | head -1)"; done
