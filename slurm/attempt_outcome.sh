# Sourced by slurm/pretrain.sbatch (never run on its own).
#
# attempt_outcome SRUN_RC STATUS_DIR: what one attempt's step came to, from srun's exit code, the rank status files
# in STATUS_DIR (pretrain/lifecycle/exit_status.py) and srun's own messages (STATUS_DIR/srun.err). srun's code alone
# cannot tell a preemption whose last tasks srun ended (143) from a crash, nor a rank's bad input from the lost
# peer its survivors then report (srun returns the highest of the tasks' codes), nor name the task that died.
# Sets:
#   rc           0 finished, 75 preempted (requeue), 76 a rank or node lost (requeue, a crash), 130 interrupted by a
#                SIGINT after its save (do not requeue), else the failure's own code (do not requeue)
#   first_death  srun's line for the first task that ended on its own (empty if none)
#   suspects     the hosts to suspect of a lost rank (comma-separated; empty if none)
#   n_preempted, n_failed, n_lost, n_interrupted   the ranks that said so
#   n_sigint     the ranks a SIGINT ended without a save
EXIT_PREEMPTED=75  # pretrain/lifecycle/exit_status.py: a complete checkpoint is saved, run the same command again
EXIT_PEER_LOST=76  # another rank died or hung: nothing saved by this attempt, the last complete checkpoint stands
EXIT_INTERRUPTED=130  # a SIGINT (scancel --signal=INT): saved, then asked to stop, not to be requeued
PROGRESS_FILE=checkpoint.json  # exit_status.py's PROGRESS_FILE: the attempt completed a checkpoint

# count_crashes JOB_STATUS ATTEMPT_DIR CRASHED: the job's crashes in a row without a new checkpoint, kept in
# JOB_STATUS/crashes (none once the attempt whose status folder is ATTEMPT_DIR completed a checkpoint, then one more
# if it CRASHED: 1), and over its whole life, in JOB_STATUS/crashes_total. MAX_CRASHES
# bounds a node that fails the job before it saves again; MAX_TOTAL_CRASHES, a fault that comes back after each save;
# neither stops a month-long run at its second unrelated node failure. Sets crashes and total_crashes.
count_crashes() {
    crashes=$(cat "$1/crashes" 2>/dev/null || echo 0)
    total_crashes=$(cat "$1/crashes_total" 2>/dev/null || echo 0)
    if [ -f "$2/$PROGRESS_FILE" ]; then crashes=0; fi
    if [ "$3" = 1 ]; then crashes=$(( crashes + 1 )); total_crashes=$(( total_crashes + 1 )); fi
    echo "$crashes" > "$1/crashes"
    echo "$total_crashes" > "$1/crashes_total"
}

# crash_cap MAX_CRASHES MAX_TOTAL_CRASHES: which cap the counts (count_crashes) reached, as the job's last words
# begin; nothing while it may requeue.
crash_cap() {
    if (( crashes >= $1 )); then
        echo "crash $crashes reached MAX_CRASHES=$1"
    elif (( total_crashes >= $2 )); then
        echo "crash $total_crashes of the job reached MAX_TOTAL_CRASHES=$2 (each after a new checkpoint)"
    fi
}

attempt_outcome() {
    rc=$1
    local dir=$2 statuses=()
    mapfile -t statuses < <(find "$dir" -maxdepth 1 -name 'rank*.json' 2>/dev/null | sort)
    with_status() {  # the status files that say $1
        local f
        for f in "${statuses[@]}"; do grep -q "\"status\": \"$1\"" "$f" 2>/dev/null && echo "$f"; done
    }
    count_status() { with_status "$1" | wc -l; }
    ended_after_saying_so() {  # whether every task of srun's list (3, 0-1, 0,2-3) said it saved or finished
        local part task
        local -a parts
        IFS=, read -ra parts <<< "$1"
        for part in "${parts[@]}"; do
            for (( task = ${part%-*}; task <= ${part#*-}; task++ )); do
                grep -q -E '"status": "(finished|stopped|preempted|interrupted)"' "$dir/rank$task.json" 2>/dev/null \
                    || return 1
            done
        done
    }
    # (A rank "terminated" was ended by srun or SLURM after another task died: it is neither a bug nor a loss.)
    n_preempted=$(count_status preempted)
    n_failed=$(count_status failed)
    n_lost=$(count_status peer_lost)
    n_interrupted=$(count_status interrupted)
    # Ended by a SIGINT (before the first step, or a second one): its peers may have lost it first and said peer_lost.
    n_sigint=$(with_status terminated | xargs -r grep -l '"error": "SIGINT"' | wc -l)
    # srun: "srun: error: NODE: task N: Killed" (or Aborted, Segmentation fault, Exited with exit code C). The first
    # task that ended on its own, neither ended by srun (Terminated) or a hang-up or interrupt someone sent (Hangup,
    # Interrupt: a rank dies of either before training, and of a SIGINT after its save), nor a survivor (76) or a
    # preempted rank (75).
    # Nor a task whose status says it had saved or finished: srun kills the rank still closing its logs (rank 0: the
    # trackers, W&B's exit) after the others' exit 75, and that rank is no lost node.
    first_death=""
    local line
    while IFS= read -r line; do
        [[ "$line" =~ :\ tasks?\ ([0-9,-]+):\  ]] && ended_after_saying_so "${BASH_REMATCH[1]}" && continue
        first_death=$line
        break
    done < <(grep -E '^srun: error: [^:]+: tasks? [0-9,-]+: ' "$dir/srun.err" 2>/dev/null \
        | grep -v -E ': (Terminated|Hangup|Interrupt|Exited with exit code (75|76))$')
    suspects=""
    if (( n_failed > 0 )); then
        # A rank stopped on its own error (bad input, a full disk, a divergence, a bug): the attempt failed with its
        # code, whatever the survivors then reported; requeueing would fail the same way.
        local failed
        failed=$(with_status failed | head -n 1)
        rc=$(sed -n 's/.*"code": \([0-9]*\).*/\1/p' "$failed" | head -n 1)
        rc=${rc:-1}
        return
    fi
    if (( $(count_status attempt_lost) > 0 )); then
        # A rank's loader worker never started (data_pipeline/loader_worker.py): no host to suspect, and what srun
        # then did to the other ranks (a SIGKILL after its grace period) names none either.
        rc=$EXIT_PEER_LOST
        return
    fi
    if [[ "$first_death" =~ Exited\ with\ exit\ code\ ([0-9]+)$ ]]; then
        # A task that exited with its own code where its status file could not say so (a full STATUS_DIR disk, an
        # error before the status was first written): a failure of its own, not a lost node.
        rc=${BASH_REMATCH[1]}
        return
    fi
    suspects=$(sed -n 's/^srun: error: \([^:]*\): .*/\1/p' <<< "$first_death")
    if [ -z "$suspects" ] && (( n_lost > 0 )); then
        # No task ended on its own: one hung (its host lost or stuck) and the survivors timed out. The ranks still
        # "running" are the hung ones.
        suspects=$(with_status running | xargs -r sed -n 's/.*"host": "\([^"]*\)".*/\1/p' | sort -u | paste -sd, -)
    fi
    if (( n_interrupted + n_sigint > 0 )) && [ -z "$first_death" ]; then
        # Asked to stop: saved and ended by the SIGINT (srun ends the last ranks with a SIGTERM), or ended by it at
        # once, a peer that lost such a rank first saying peer_lost. Not a node lost: not requeued.
        rc=$EXIT_INTERRUPTED
        return
    fi
    if (( rc != 0 && rc != EXIT_PREEMPTED && n_preempted > 0 && n_lost == 0 )) && [ -z "$first_death" ]; then
        rc=$EXIT_PREEMPTED  # srun ended the last ranks of a preemption (143): they had saved
        return
    fi
    if (( rc != 0 && ${#statuses[@]} > 0 && $(count_status finished) == ${#statuses[@]} )) && [ -z "$first_death" ]; then
        rc=0  # every rank finished and said so; srun then ended one still closing its logs
        return
    fi
    if (( rc != 0 && rc != EXIT_PREEMPTED )) && { [ -n "$first_death" ] || (( n_lost > 0 )); }; then
        rc=$EXIT_PEER_LOST
    fi
}

# saved_before_slurm_ended_it STATUS_DIR: whether the ranks of an attempt that SLURM itself ended (no `ended` mark: the
# batch shell died with the job, on SLURM's preemption or an outside `scontrol requeue`) had saved a complete checkpoint
# on its SIGTERM: what attempt_outcome makes of their status files with srun's code for such an end (143).
saved_before_slurm_ended_it() {
    attempt_outcome 143 "$1"
    (( rc == EXIT_PREEMPTED ))
}
