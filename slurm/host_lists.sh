# Sourced by slurm/pretrain.sbatch and slurm/exclude_and_release.sh (never run on its own).
#
# SLURM host lists are written in its compressed form ("gpu[01,05-07],cpu3"), which a split on commas cuts inside
# the brackets: these expand them through `scontrol show hostnames` (which needs the cluster's slurm.conf).

# host_names LIST...: each host of the lists (comma-separated, compressed or not), one per line, sorted, once each.
host_names() {
    local list
    for list in "$@"; do
        [ -n "$list" ] && [ "$list" != "(null)" ] && scontrol show hostnames "$list"
    done | sort -u
}

# merged_hosts LIST...: the hosts of all the lists as one plain comma-separated list (ExcNodeList's input).
merged_hosts() { host_names "$@" | paste -sd, -; }

# same_hosts A B: whether the two lists name the same hosts, however each is written.
same_hosts() { [ "$(merged_hosts "$1")" = "$(merged_hosts "$2")" ]; }
