#!/bin/sh
# The Debian packages the tests use besides Python's (`make install` runs this; so can you, at any time):
#   chromium   headless screenshots of the offline preview (tests/test_site.py)
#   postgresql a database server for the cluster path of tuning (tests/test_tune_postgres.py)
#   libcairo2  the cairo library CairoSVG renders the icon themes' SVG drawings with (dml_book.data.icons)
#   *-icon-theme, *-icons ...  the icon themes of the dataset `icons` (dml_book.data.icons.ICON_PACKAGES; about 1.2 GB)
# One package a line in PACKAGES below. Those missing are installed with apt-get when this runs as root on a system
# that has it; otherwise the command that installs them is printed and the tests that need them are skipped, each
# naming the same command. Exit status 0 either way: a machine without them still builds and runs the other tests.
#   tools/system_packages.sh            install what is missing (or print how)
#   tools/system_packages.sh --command  print the install command for what is missing (nothing when all are present)
PACKAGES="
chromium
postgresql
libcairo2
adwaita-icon-theme
breeze-icon-theme
papirus-icon-theme
oxygen-icon-theme
tango-icon-theme
gnome-icon-theme
mate-icon-theme
elementary-icon-theme
elementary-xfce-icon-theme
faenza-icon-theme
obsidian-icon-theme
faba-icon-theme
moka-icon-theme
numix-icon-theme
numix-icon-theme-circle
paper-icon-theme
gnome-icon-theme-gartoon
gnome-icon-theme-nuovo
gnome-icon-theme-yasis
gnome-icon-theme-suede
gnome-colors-common
gnome-brave-icon-theme
deepin-icon-theme
lxde-icon-theme
mint-y-icons
suru-icon-theme
yaru-theme-icon
sugar-icon-theme
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
