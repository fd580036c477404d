// Command etcd is etcd's own server entry point, built from the
// go.etcd.io/etcd/server/v3 module at the version go.mod pins, so that the
// control-plane test tier needs no prebuilt binary.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
