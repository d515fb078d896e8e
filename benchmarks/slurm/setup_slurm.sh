#!/bin/bash
# Single-node SLURM 22.05 (Debian 12) test cluster: munge + slurmctld + slurmd as root, no systemd.
# Used by benchmarks/queue_service.py (stop it with stop_slurm.sh); SLURMCTLD_DEBUG (default debug)
# sets slurmctld's log level.
set -euo pipefail
FAKEGPU_DIR=${FAKEGPU_DIR:-/run/slurm-fakegpu}
# cgroup (v1 freezer; works on this machine kind) kills every process of a job; linuxproc loses orphans (see 4.6)
PROCTRACK=${PROCTRACK:-cgroup}
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends slurmctld slurmd slurm-client munge >/dev/null
mkdir -p /etc/slurm /var/spool/slurmctld /var/spool/slurmd /var/log/slurm /run/munge "$FAKEGPU_DIR"
chown munge:munge /run/munge; chmod 0755 /run/munge
# the munge package's postinst creates /etc/munge/munge.key; make one if it is missing
[ -s /etc/munge/munge.key ] || { runuser -u munge -- mungekey -c -k /etc/munge/munge.key 2>/dev/null || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chown munge:munge /etc/munge/munge.key; chmod 0400 /etc/munge/munge.key; }; }
# 4 fake GPUs: slurmd insists that gres File= entries are character/block devices -> clones of /dev/null
for i in 0 1 2 3; do [ -c "$FAKEGPU_DIR/nvidia$i" ] || mknod "$FAKEGPU_DIR/nvidia$i" c 1 3; done
cat > /etc/slurm/slurm.conf <<CONF
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
SchedulerType=sched/backfill
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
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
# jobs younger than this are never picked for preemption (0 = off)
PreemptExemptTime=${PREEMPT_EXEMPT_TIME:-00:00:00}
# at preemption, send the job's --signal (e.g. B:USR1) at once, instead of SIGTERM to its steps
SlurmctldParameters=preempt_send_user_signal
JobRequeue=1
# a batch job that exits 85 is requeued automatically
RequeueExit=85
# seconds between SIGTERM and SIGKILL when a job is ended (cancel, time limit, end of GraceTime)
KillWait=10
MessageTimeout=10
NodeName=localhost NodeAddr=127.0.0.1 CPUs=4 Boards=1 SocketsPerBoard=1 CoresPerSocket=4 ThreadsPerCore=1 RealMemory=1000 Gres=gpu:4 State=UNKNOWN
PartitionName=batch       Nodes=localhost Default=YES PriorityTier=1  PreemptMode=REQUEUE GraceTime=20 MaxTime=INFINITE State=UP
PartitionName=interactive Nodes=localhost Default=NO  PriorityTier=10 PreemptMode=OFF     MaxTime=INFINITE State=UP
CONF
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
