#!/bin/bash
# usage: cgrun.sh OUTNAME BINARY [env assignments...] ; prints total Ir
out=$1; bin=$2; shift 2
env "$@" valgrind --tool=callgrind --callgrind-out-file=/tmp/perf-cg/$out.cg "$bin" > /tmp/perf-cg/$out.log 2>&1
echo "$out $(grep -E '^(summary|totals):' /tmp/perf-cg/$out.cg | head -1)"
