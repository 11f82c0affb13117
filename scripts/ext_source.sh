# ext_source.sh - sourced by the scripts that build other projects' code against
# gdrpy (prepare_ext.sh, ucx_build.sh): where that project's source comes from.
#
#   dir=$(ext_source NAME GIVEN OPTION VARIABLE URL) || exit 1
#
# Prints a git repository (bare or not) or an unpacked source tree of NAME:
#   GIVEN (the calling script's OPTION, else the environment's VARIABLE), which
#   must exist;
#   else a bare clone of URL in .ext/src/NAME.git (ignored by git), made on first
#   use and reused after (remove it to clone anew).
# Fails with a message naming OPTION and VARIABLE when neither gives a source.
ext_source() {
    local name=$1 given=$2 opt=$3 var=$4 url=$5
    local how="give $opt DIR or set $var=DIR (a git repository or an unpacked source tree)"
    if [ -n "$given" ]; then
        if [ ! -d "$given" ]; then
            echo "no $name source at $given: $how" >&2
            return 1
        fi
        printf '%s\n' "$given"
        return 0
    fi
    local root clone
    root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    clone="$root/.ext/src/$name.git"
    if [ ! -d "$clone" ]; then
        echo "$name source: none given ($opt, \$$var); cloning $url into $clone" >&2
        mkdir -p "$root/.ext/src"
        rm -rf "$clone.part"
        if ! GIT_TERMINAL_PROMPT=0 git clone --quiet --bare "$url" "$clone.part" >&2; then
            rm -rf "$clone.part"
            echo "no $name source: cloning $url failed; $how" >&2
            return 1
        fi
        mv "$clone.part" "$clone"
    fi
    printf '%s\n' "$clone"
}

# ext_is_git DIR: DIR is a git repository itself (bare, or with its own .git), not
# a source tree that merely lies inside one (such as .ext/gdrcopy in this checkout).
ext_is_git() {
    [ -e "$1/.git" ] || [ "$(git -C "$1" rev-parse --is-bare-repository 2>/dev/null)" = true ]
}

# ext_unpack SRC TAG DEST: DEST becomes the tree of git repository SRC at TAG, or a
# copy of source tree SRC (whose release is then the caller's word).
ext_unpack() {
    local src=$1 tag=$2 dest=$3
    rm -rf "$dest"
    mkdir -p "$dest"
    if ext_is_git "$src"; then
        git -C "$src" archive "$tag" | tar x -C "$dest"
    else
        cp -a "$src"/. "$dest"/
    fi
}
