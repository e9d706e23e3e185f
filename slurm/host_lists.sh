# Sourced by slurm/pretrain.sbatch and slurm/exclude_and_release.sh (never run on its own).
#
# SLURM host lists are written in its compressed form ("gpu[01,05-07],cpu3"), which a split on commas cuts inside
# the brackets: these expand them through `scontrol show hostnames` (which needs the cluster's slurm.conf). Each
# fails (status 1, no output) where scontrol cannot expand a list: a caller must never take that for "no hosts".

# host_names LIST...: each host of the lists (comma-separated, compressed or not; "" and "(null)" name none), one per
# line, sorted, once each.
host_names() {
    local list expanded all=""
    for list in "$@"; do
        if [ -n "$list" ] && [ "$list" != "(null)" ]; then
            expanded=$(scontrol show hostnames "$list") && [ -n "$expanded" ] || return 1
            all+="$expanded"$'\n'
        fi
    done
    [ -z "$all" ] || printf '%s' "$all" | sort -u
}

# merged_hosts LIST...: the hosts of all the lists as one plain comma-separated list (ExcNodeList's input).
merged_hosts() {
    local names
    names=$(host_names "$@") || return 1
    [ -z "$names" ] || paste -sd, - <<< "$names"
}

# same_hosts A B: whether the two lists name the same hosts, however each is written; false where either cannot be
# read.
same_hosts() {
    local a b
    a=$(merged_hosts "$1") && b=$(merged_hosts "$2") && [ "$a" = "$b" ]
}
