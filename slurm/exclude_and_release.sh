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

for _ in $(seq 300); do
    [ "$(field JobState)" = PENDING ] && break
    sleep 1
done
if [ "$(field JobState)" != PENDING ]; then
    say "job $job did not return to the queue (state $(field JobState)): nothing excluded, nothing released"
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
