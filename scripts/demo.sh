#!/bin/sh
# What `make demo` runs. Until the simulator exists this shows the parts that
# do: an embedded etcd, members joining, a lease expiring and the watch
# reporting it.
set -eu
BUILD=${BUILD:-build}
if [ -x "$BUILD/bin/graft-sim" ]; then
    exec "$BUILD/bin/graft-sim" run
fi
exec "$BUILD/bin/graft-demo"
