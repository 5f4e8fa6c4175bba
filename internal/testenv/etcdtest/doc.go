// Package etcdtest runs a real etcd cluster (embedded members, go.etcd.io/etcd/server/v3/embed)
// for tests.
package etcdtest

import (
	_ "go.etcd.io/etcd/client/v3"
	_ "go.etcd.io/etcd/server/v3/embed"
)
