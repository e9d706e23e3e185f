# Sourced by the sbatch templates, in the repository (after `cd "$REPO_DIR"`), with `say` defined.

# activate_venv VENV: activate the virtual environment at VENV where there is one (ENV_SETUP may have set up a conda or
# module environment instead), and say which Python the job runs, so a wrong REPO_DIR or VENV shows in the job's log
# on its first line rather than as an import error of every task.
activate_venv() {
    local venv=${1:?activate_venv VENV} note=""
    if [ -f "$venv/bin/activate" ]; then
        # shellcheck disable=SC1091
        source "$venv/bin/activate"
    else
        note=" (no virtual environment at $venv: the PATH's)"
    fi
    say "repository $PWD; python $(command -v python || echo 'not found on PATH')$note"
}
