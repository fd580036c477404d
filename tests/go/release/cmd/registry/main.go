// Command registry is the CNCF Distribution registry's own entry point
// (github.com/distribution/distribution/v3 at the version go.mod pins) with
// the filesystem and in-memory storage drivers only: the release test
// (tests/release/registry.sh) runs it on loopback, and the cloud drivers
// upstream's cmd/registry links in (S3, GCS, Azure) would only lengthen the
// build.
package main

import (
	"os"

	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
)

func main() {
	if err := registry.RootCmd.Execute(); err != nil {
		os.Exit(1)
	}
}
