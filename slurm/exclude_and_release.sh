#!/usr/bin/env bash
# Run as a tiny job of its own by pretrain.sbatch: SLURM changes a job's ExcNodeList only while the job
# is pending, so a job cannot exclude a node from itself while it runs. The job requeues itself held;
# this waits until it is pending, excludes HOSTS, reads the list back and releases the job. If the
# exclusion does not take (a submit plugin may rewrite ExcNodeList), it cancels the job instead of
# letting it run again on the node that failed.
#
#   bash slurm/exclude_and_release.sh JOB_ID HOSTS CRASHES
set -uo pipefail
# shellcheck source=slurm/host_lists.sh
source "$(dirname "${BASH_SOURCE[0]}")/host_lists.sh"
job=$1 hosts=$2 crashes=${3:-?}
say() { echo "[exclude_and_release $(date '+%F %T')] $*"; }
field() { scontrol show job "$job" | sed -n "s/.*$1=\\([^ ]*\\).*/\\1/p" | head -n 1; }

# A job whose node is really gone stays COMPLETING until slurmctld marks the node down (SlurmdTimeout, 300 s by
# default, plus a ping): wait for most of this helper's own time limit (pretrain.sbatch gives it 30 minutes).
wait_s=${EXCLUDE_WAIT_S:-1680}
SECONDS=0  # the wall clock (scontrol's own time counts)
while (( SECONDS < wait_s )); do
    state=$(field JobState)
    case "$state" in
        PENDING) break ;;
        CANCELLED|COMPLETED|FAILED|TIMEOUT|OUT_OF_MEMORY|DEADLINE|BOOT_FAIL|NODE_FAIL)
            say "job $job ended ($state) instead of returning to the queue: nothing to exclude or release"
            exit 1 ;;
    esac
    sleep 2
done
if [ "$(field JobState)" != PENDING ]; then
    say "job $job did not return to the queue within ${wait_s}s (state $(field JobState)): it stays held, not run again on $hosts; once it is PENDING, run: scontrol update JobId=$job ExcNodeList=$hosts && scontrol release $job"
    exit 1
fi
scontrol update JobId="$job" ExcNodeList="$hosts"
got=$(field ExcNodeList)
if ! same_hosts "$got" "$hosts"; then  # SLURM may write back "n[1-2]" for "n1,n2"
    say "the exclusion of $hosts from job $job did not take (ExcNodeList=$got) after crash $crashes on $hosts: cancelling the job rather than run it on that node again"
    scancel "$job"
    exit 1
fi
scontrol release "$job"
say "job $job: excluded $hosts (scontrol show job confirms ExcNodeList=$got) and released it"
