#!/usr/bin/env bash
# Runs the test tiers named as arguments (Makefile targets), each to its end even when an
# earlier one failed, then prints one line per tier: its wall time and result. Exits 1 when
# any tier failed. `make test` calls it, so CI's log shows where the minutes went.
set -u
declare -a names=() seconds=() results=()
failed=0
for tier in "$@"; do
  printf '\n=== tier %s ===\n' "$tier"
  start=$(date +%s)
  if make --no-print-directory "$tier"; then result=ok; else result=FAILED; failed=1; fi
  names+=("$tier")
  seconds+=($(($(date +%s) - start)))
  results+=("$result")
done
total=0
printf '\n%-22s %8s  %s\n' tier seconds result
for i in "${!names[@]}"; do
  printf '%-22s %8d  %s\n' "${names[$i]}" "${seconds[$i]}" "${results[$i]}"
  total=$((total + seconds[i]))
done
printf '%-22s %8d\n' total "$total"
exit "$failed"
