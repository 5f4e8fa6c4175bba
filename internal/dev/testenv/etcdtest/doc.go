// Package etcdtest runs a real etcd cluster for tests: every member is an
// embedded etcd server (go.etcd.io/etcd/server/v3/embed) inside the test
// process, listening on one IP address so that hosts in other network
// namespaces can reach it over a bridge.
//
// A test starts the cluster with Start, talks to it with Client, takes
// members down and up with StopMember and RestartMember to exercise quorum
// loss, and stops it with Close. Each member logs to mN.log in the
// cluster's directory, and clients made by Client log to client.log there,
// so test output stays quiet and failures can point at the files.
package etcdtest
