#!/usr/bin/env bash
# Fails when the last build used a Debian package that scripts/setup.sh does
# not install. A machine that kept a package from an older setup (or one
# installed by hand) builds and passes where a fresh one stops; this catches
# it on the machine that has the package. Usage:
#   scripts/check_deps.sh [BUILD_DIR ...]   (default: build)
# Reads what each build read from /usr: the headers of Ninja's dependency log
# and the libraries of its link lines (files, and -lNAME resolved as the
# linker would). Each file's owning package must be named in setup.sh, be a
# dependency (recursively) of one it names, or be part of every Debian system
# (priority required/important, or essential). Part of scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
setup=scripts/setup.sh
builds=("$@")
((${#builds[@]})) || builds=(build)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

: > "$tmp/files"
for b in "${builds[@]}"; do
  [ -f "$b/.ninja_deps" ] || { echo "check_deps: $b has no Ninja dependency log (build it with scripts/build.sh first)" >&2; exit 2; }
  ninja -C "$b" -t deps | awk '$1 ~ /^\/usr\// {print $1}' >> "$tmp/files"
  find "$b" -name build.ninja -print0 | xargs -0 grep -ohE '/usr/lib/[^ ]+\.(so|a)(\.[0-9]+)*' >> "$tmp/files" || true
  for lib in $(find "$b" -name build.ninja -print0 | xargs -0 grep -ohE '(^| )-l[A-Za-z0-9_+.-]+' | sed 's/^ *-l//' | sort -u); do
    for d in /usr/lib/x86_64-linux-gnu /usr/lib; do
      if [ -e "$d/lib$lib.so" ]; then readlink -f "$d/lib$lib.so"; break; fi
      if [ -e "$d/lib$lib.a" ]; then echo "$d/lib$lib.a"; break; fi
    done
  done >> "$tmp/files"
done
sort -u "$tmp/files" -o "$tmp/files"
# Owners; files no package owns (e.g. generated, or under /usr/local) are skipped.
xargs -a "$tmp/files" -r dpkg -S 2>/dev/null | grep -v '^diversion' > "$tmp/owners" || true
cut -d: -f1 "$tmp/owners" | tr ',' '\n' | tr -d ' ' | sort -u > "$tmp/used"

# What setup.sh installs: every installed package named in it as a word, and
# what those depend on.
dpkg-query -W -f='${Package}\n' | sort -u > "$tmp/installed"
grep -v '^[[:space:]]*#' "$setup" | tr -c 'A-Za-z0-9.+-' '\n' | sort -u | comm -12 - "$tmp/installed" > "$tmp/named"
{
  cat "$tmp/named"
  xargs -a "$tmp/named" -r apt-cache depends --recurse --installed --no-recommends --no-suggests \
    --no-conflicts --no-breaks --no-replaces --no-enhances 2>/dev/null |
    sed -n 's/^ *\(Pre\)\{0,1\}Depends: *<\{0,1\}\([^>:]*\).*/\2/p; s/^\([A-Za-z0-9][^ :]*\)$/\1/p'
  dpkg-query -W -f='${Package} ${Priority} ${Essential}\n' | awk '$2 == "required" || $2 == "important" || $3 == "yes" {print $1}'
} | sort -u > "$tmp/covered"

comm -23 "$tmp/used" "$tmp/covered" > "$tmp/missing"
if [ -s "$tmp/missing" ]; then
  echo "check_deps: the build (${builds[*]}) used these Debian packages, which $setup does not install; a fresh machine lacks them:" >&2
  while read -r p; do
    printf '  %s (e.g. %s)\n' "$p" "$(grep -m1 -E "(^|, )$p(:[a-z0-9]+)?(,|:)" "$tmp/owners" | sed 's/^[^/]*//')" >&2
  done < "$tmp/missing"
  exit 1
fi
echo "check_deps: every Debian package the build used ($(wc -l < "$tmp/used")) is installed by $setup"
