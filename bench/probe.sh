#!/bin/bash
# One benchmark job: works for SECONDS, then appends when it started and ended, and where
# (CUDA_VISIBLE_DEVICES), to LOG: one line, one write, so concurrent jobs never interleave.
# usage: probe.sh LOG JOB_ID SECONDS
start=$EPOCHREALTIME
if [ "$3" != 0 ]; then sleep "$3"; fi
echo "$2 $start $EPOCHREALTIME ${CUDA_VISIBLE_DEVICES-unset}" >>"$1"
