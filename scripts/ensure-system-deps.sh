#!/usr/bin/env bash
# System packages the real operators need: tesseract-ocr (OCR of scanned PDF pages).
set -euo pipefail
if command -v tesseract >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing tesseract-ocr with apt-get"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tesseract-ocr tesseract-ocr-eng >/dev/null
else
  echo "tesseract-ocr is missing. Install it, then rerun:" >&2
  echo "  Debian/Ubuntu: sudo apt-get install tesseract-ocr" >&2
  echo "  macOS:         brew install tesseract" >&2
  exit 1
fi
