#!/bin/bash
# A one-node SLURM 22.05 (Debian 12) on this machine: munge, slurmctld and slurmd as root, no
# systemd, 4 CPUs and 4 fake GPUs. For trying the integration and for our tests; not for production.
#
#   integrations/slurm/local/start.sh POLICY.conf     # e.g. the output of
#                                                     # `preemptible queue export --to slurm`
#   integrations/slurm/local/stop.sh
#
# POLICY.conf holds the scheduling policy (SchedulerType, Preempt*, RequeueExit, Priority*,
# SlurmctldParameters) and the partitions with Nodes=ALL; this script writes the rest: the
# daemons, the node and its GPUs. Installs slurmctld, slurmd, slurm-client and munge with apt when
# they are missing. Starts from a clean state (no jobs), so stop.sh first if one is running.
# SLURMCTLD_DEBUG (default debug) sets slurmctld's log level; PROCTRACK (default cgroup) the
# process tracking: cgroup kills every process of a job, linuxproc loses the ones that escape
# their parent (docs/schedulers.md).
set -euo pipefail
POLICY=${1:?usage: start.sh POLICY.conf (e.g. from preemptible queue export --to slurm)}
[ -r "$POLICY" ] || { echo "start.sh: cannot read $POLICY" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "start.sh: run as root (the daemons run as root here)" >&2; exit 2; }
MARK="# Written by preemptible's integrations/slurm/local/start.sh"
if [ -s /etc/slurm/slurm.conf ] && ! grep -qxF "$MARK" /etc/slurm/slurm.conf && [ "${FORCE:-0}" != 1 ]; then
  echo "start.sh: /etc/slurm/slurm.conf was not written by this script; not replacing it" \
       "(move it away, or FORCE=1)" >&2
  exit 2
fi
FAKEGPU_DIR=${FAKEGPU_DIR:-/run/slurm-fakegpu}
PROCTRACK=${PROCTRACK:-cgroup}
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null \
   || ! command -v sbatch >/dev/null; then
  echo "installing slurmctld slurmd slurm-client munge (apt)"
  install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
    slurmctld slurmd slurm-client munge >/dev/null; }
  install || { apt-get update -q >/dev/null && install; }
fi
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge "$FAKEGPU_DIR"
chown munge:munge /run/munge; chmod 0755 /run/munge
# the munge package's postinst creates /etc/munge/munge.key; make one if it is missing
[ -s /etc/munge/munge.key ] || { runuser -u munge -- mungekey -c -k /etc/munge/munge.key 2>/dev/null || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key; }; }
# 4 fake GPUs: slurmd insists that gres File= entries are character/block devices -> clones of /dev/null
for i in 0 1 2 3; do [ -c "$FAKEGPU_DIR/nvidia$i" ] || mknod "$FAKEGPU_DIR/nvidia$i" c 1 3; done
cat > /etc/slurm/slurm.conf <<CONF
$MARK
ClusterName=local
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# requeued jobs become eligible cred_expire+1 s after the requeue (default 120 s)
AuthInfo=cred_expire=10
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
SlurmctldDebug=${SLURMCTLD_DEBUG:-debug}
SlurmdDebug=info
ProctrackType=proctrack/${PROCTRACK}
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# main scheduler and backfill every 2 s (defaults 60 s / 30 s) so preemption and restarts are quick
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
ReturnToService=2
# accept the CPU count and GRES below although the box has 2 cores and no GPU
SlurmdParameters=config_overrides
GresTypes=gpu
# seconds between SIGTERM and SIGKILL when a job is ended (cancel, time limit, end of GraceTime)
KillWait=10
MessageTimeout=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
# --- the policy: $POLICY
CONF
cat "$POLICY" >> /etc/slurm/slurm.conf
cat > /etc/slurm/cgroup.conf <<CONF
CgroupPlugin=cgroup/v1
CgroupAutomount=no
CgroupMountpoint=/sys/fs/cgroup
ConstrainCores=no
ConstrainRAMSpace=no
ConstrainDevices=no
CONF
cat > /etc/slurm/gres.conf <<CONF
AutoDetect=off
NodeName=localhost Name=gpu File=$FAKEGPU_DIR/nvidia[0-3]
CONF
[ -f /run/munge/munged.pid ] && kill -0 "$(cat /run/munge/munged.pid)" 2>/dev/null || runuser -u munge -- /usr/sbin/munged
for i in $(seq 50); do munge -n </dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.1; done
# -c: start from a clean state (a DRAIN/INVAL node state and old jobs would otherwise survive restarts)
/usr/sbin/slurmctld -c
for i in $(seq 100); do scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.1; done
/usr/sbin/slurmd -N localhost
for i in $(seq 150); do sinfo -h -N -o %t 2>/dev/null | grep -q idle && break; sleep 0.2; done
sinfo -h -N -o %t | grep -q -E "drain|inval|down" && scontrol update NodeName=localhost State=RESUME && sleep 1
sinfo -h -N -o "%N %t %G" | grep -q idle || { echo "node not idle"; sinfo; tail -n 20 /var/log/slurm/slurmctld.log /var/log/slurm/slurmd.log; exit 1; }
echo "slurm up: munged=$(cat /run/munge/munged.pid) slurmctld=$(cat /run/slurmctld.pid) slurmd=$(cat /run/slurmd.pid)"
