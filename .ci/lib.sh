# Helpers for the CI scripts (sourced).

# python_for 3.11: an interpreter of that version (pyenv's, else pythonX.Y).
python_for() {
  local candidate
  for candidate in "$(pyenv root 2>/dev/null)"/versions/"$1".*/bin/python3 "$(command -v "python$1")"; do
    if [ -x "$candidate" ]; then echo "$candidate"; return; fi
  done
  echo "no Python $1 found (pyenv install $1, or put python$1 on PATH)" >&2
  return 1
}

# fresh_venv DIR PYTHON: a new virtual environment.
fresh_venv() {
  rm -rf "$1"
  "$2" -m venv "$1"
}

# path_without_compilers DIR [all|cuda]: prints a PATH of symlinks in DIR to
# every program on today's PATH but the CUDA compiler tools (cuda), or those
# and every C/C++ compiler (all).
path_without_compilers() {
  local dir=$1 which=${2:-all} entry file name
  rm -rf "$dir"; mkdir -p "$dir"
  local -a entries; IFS=: read -ra entries <<< "$PATH"
  for entry in "${entries[@]}"; do
    for file in "$entry"/*; do
      name=${file##*/}
      [ -f "$file" ] && [ -x "$file" ] && [ ! -e "$dir/$name" ] || continue
      case $name in
        nvcc|ptxas|nvlink|fatbinary|cudafe++|__nvcc_device_query) continue ;;
      esac
      if [ "$which" = all ]; then
        case $name in
          cc|c++|cpp|c89|c99|gcc|g++|gcc-*|g++-*|cpp-*|*-gcc|*-g++|*-gcc-*|*-g++-*|clang*|icx|icpx) continue ;;
        esac
      fi
      ln -s "$file" "$dir/$name"
    done
  done
  echo "$dir"
}

# The CUDA toolkits installed on this machine, for CMake to ignore.
system_cuda_prefixes() {
  ls -d /usr/local/cuda /usr/local/cuda-* /opt/cuda 2>/dev/null | paste -sd';'
}

# timed NAME COMMAND...: runs COMMAND, appends "NAME  SECONDS" to $CI_TIMES.
timed() {
  local name=$1 start=$SECONDS; shift
  echo "::: $name"
  "$@"
  printf '%-58s %5d s\n' "$name" $((SECONDS - start)) | tee -a "$CI_TIMES"
}
