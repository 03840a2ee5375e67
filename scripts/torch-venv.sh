# PyTorch's venv for pebble's scripts (scripts/torch_pipeline.sh,
# scripts/export-onnx-models.sh) and pebble.torch's tests (scripts/py-venv.sh --torch),
# sourced from the repository root. Defines `py` and `with_stubs`, and installs PyTorch
# into target/torch-venv once (a venv whose torch imports is reused):
#   1. on a machine without an NVIDIA GPU, the CPU-only wheel from PyTorch's own index;
#   2. else, on a machine with an NVIDIA GPU and 8 GiB free on the disk, the wheel from
#      PyPI with its CUDA dependencies;
#   3. else the PyPI wheel without its dependencies, its pure-Python dependencies, and
#      stub CUDA libraries (scripts/torch_cuda_stubs.py) so that it runs on the CPU: the
#      NVIDIA wheels take 4 GiB and a minute to install, for a GPU that is not there. The
#      stubs go where torch's libraries look for the NVIDIA ones (their rpath,
#      nvidia/cu13/lib), so nothing needs LD_LIBRARY_PATH. Such a venv is made again on a
#      machine with a GPU.
# TORCH_SPEC overrides the version (default: the one crates/schedule/src/torch.rs
# follows, whose `_PipelineScheduleRuntime._load_csv` format the export writes).

venv=target/torch-venv
# Venvs made before 2026-12-07 kept their stubs here, on LD_LIBRARY_PATH.
stubs="$venv/cuda-stubs"
spec="${TORCH_SPEC:-torch==2.15.0}"
py="$venv/bin/python"

with_stubs() {
    if [ -d "$stubs" ]; then
        LD_LIBRARY_PATH="$(pwd)/$stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
    else
        "$@"
    fi
}

gpu=""
{ [ -e /dev/nvidiactl ] || nvidia-smi -L >/dev/null 2>&1; } && gpu=yes
# A venv with stub CUDA libraries is made again where there is a GPU to use.
stubbed=""
[ -e "$venv/.cuda-stubs" ] || [ -d "$stubs" ] && stubbed=yes

if ! [ -x "$py" ] || ! with_stubs "$py" -c "import torch.distributed.pipelining" 2>/dev/null \
    || { [ -n "$gpu" ] && [ -n "$stubbed" ]; }; then
    command -v python3 >/dev/null || { echo "torch-venv: python3 is required" >&2; exit 1; }
    rm -rf "$venv"
    python3 -m venv "$venv"
    pip=("$venv/bin/pip" install --disable-pip-version-check --no-cache-dir)
    free_kib=$(df -Pk target | awk 'NR == 2 { print $4 }')
    if [ -z "$gpu" ] && "${pip[@]}" --retries 1 "$spec" --index-url https://download.pytorch.org/whl/cpu; then
        echo "torch-venv: installed $spec, CPU-only, from PyTorch's index"
    elif [ -n "$gpu" ] && [ "$free_kib" -ge $((8 * 1024 * 1024)) ]; then
        echo "torch-venv: PyTorch's index unreachable; installing $spec from PyPI"
        "${pip[@]}" "$spec"
    else
        why="no NVIDIA GPU here"
        [ -z "$gpu" ] || why="$((free_kib / 1024 / 1024)) GiB free"
        echo "torch-venv: PyTorch's index unreachable and $why;" \
            "installing $spec from PyPI without its CUDA dependencies, with stub CUDA libraries"
        command -v readelf >/dev/null && command -v cc >/dev/null ||
            { echo "torch-venv: the stubs need readelf (binutils) and cc" >&2; exit 1; }
        "${pip[@]}" --no-deps "$spec"
        # Its dependencies that hold everywhere (no environment marker; the NVIDIA ones
        # have one), as the wheel's metadata names them, and numpy.
        read -ra deps < <("$py" -c "from importlib.metadata import requires
print(' '.join(r for r in requires('torch') if ';' not in r))")
        "${pip[@]}" "${deps[@]}" numpy
        site=$("$py" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
        "$py" scripts/torch_cuda_stubs.py "$site" "$site/nvidia/cu13/lib"
        touch "$venv/.cuda-stubs"
    fi
fi

