# Sourced by the sbatch templates (never run on its own).
#
# split_words ARRAY LABEL STRING: STRING's shell words, split with the shell's quoting rules but never run (no eval),
# into the array named ARRAY. A string whose quotes do not close is refused (exit 2) rather than read as no words,
# which would run the job with none of the settings it was given.
split_words() {
    local out
    if ! out=$(python -c 'import shlex, sys; sys.stdout.write("".join(w + "\n" for w in shlex.split(sys.argv[1])))' "$3" 2>&1); then
        echo "error: $2 cannot be split into words (${out##*$'\n'}): check its quotes: $3" >&2
        exit 2
    fi
    mapfile -t "$1" < <(printf '%s' "$out")
}
