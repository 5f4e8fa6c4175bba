package imagestore

import "testing"

// MakeImage is testImage for the tests outside the package.
var MakeImage = testImage

// ServeImage serves b at path on a loopback HTTP server for the test: its
// URL.
func ServeImage(t testing.TB, path string, b []byte) string {
	srv := newImageServer(t, 0)
	srv.put(path, b)
	return srv.URL + path
}
