#!/bin/bash
# Cancel jobs, then stop slurmd, slurmctld, munged by their PID files.
# NB: stopping slurmd does NOT end running jobs (slurmstepd + job processes survive), so cancel first.
if scontrol ping 2>/dev/null | grep -q UP; then
  ids=$(squeue -h -o %i); [ -n "$ids" ] && scancel $ids
  for i in $(seq 200); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.2; done
fi
for pf in /run/slurmd.pid /run/slurmctld.pid /run/munge/munged.pid; do
  [ -f "$pf" ] || continue; P=$(cat "$pf"); kill -0 "$P" 2>/dev/null || continue
  kill -TERM "$P"; for i in $(seq 300); do kill -0 "$P" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$P" 2>/dev/null && kill -KILL "$P"; echo "stopped $pf ($P)"
done
