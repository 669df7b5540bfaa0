#!/bin/sh
# The Debian packages the tests use besides Python's (`make install` runs this; so can you, at any time):
#   chromium   headless screenshots of the offline preview (tests/test_site.py)
#   postgresql a database server for the cluster path of tuning (tests/test_tune_postgres.py)
# One package a line in PACKAGES below. Those missing are installed with apt-get when this runs as root on a system
# that has it; otherwise the command that installs them is printed and the tests that need them are skipped, each
# naming the same command. Exit status 0 either way: a machine without them still builds and runs the other tests.
#   tools/system_packages.sh            install what is missing (or print how)
#   tools/system_packages.sh --command  print the install command for what is missing (nothing when all are present)
PACKAGES="
chromium
postgresql
"
missing=""
for p in $PACKAGES; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing="$missing $p"
done
missing="${missing# }"
command="sudo apt-get install -y $missing"
if [ "$1" = "--command" ]; then [ -n "$missing" ] && echo "$command"; exit 0; fi
if [ -z "$missing" ]; then exit 0; fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "system_packages: installing $missing"
    export DEBIAN_FRONTEND=noninteractive
    if apt-get update -qq && apt-get install -y -qq $missing; then exit 0; fi
    echo "system_packages: apt-get could not install $missing; the tests that need them are skipped"
else
    echo "system_packages: missing Debian packages: $missing; install them with: $command (the tests that need them are skipped)"
fi
exit 0
