package remotetest

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/vmsup/vmsup/remoteapi"
)

// checkSchema calls the server's routes on running VM vm and validates
// every answer (status, headers, body; each line of a stream) against the
// checked-in openapi.json.
func (h *host) checkSchema(t *testing.T, vm string) {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromData(remoteapi.OpenAPI)
	if err != nil {
		t.Fatal(err)
	}
	doc.Servers = openapi3.Servers{{URL: h.url}}
	router, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	admin, viewer := h.httpClient(t, "admin"), h.httpClient(t, "viewer")
	calls := []struct {
		c            *http.Client
		method, path string
		body         string
		status       int
	}{
		{admin, "GET", "/v1/vms", "", 200},
		{admin, "GET", "/v1/names", "", 200},
		{admin, "GET", "/v1/vms/" + vm, "", 200},
		{admin, "GET", "/v1/vms/nosuch", "", 404},
		{admin, "GET", "/v1/vms/" + vm + "/spec", "", 200},
		{admin, "GET", "/v1/stats", "", 200},
		{admin, "GET", "/v1/vms/" + vm + "/snapshots", "", 200},
		{admin, "POST", "/v1/plan", `{"file": {"name": "x.toml", "content": ` + jsonString("cpus = 2\n"+guestTOML(vm)) + `}, "adopt": true}`, 200},
		{admin, "POST", "/v1/vms/" + vm + "/pause", "", 200},
		{admin, "POST", "/v1/vms/" + vm + "/resume", "", 200},
		{admin, "POST", "/v1/vms/" + vm + "/exec", `{"argv": ["echo", "hi"], "timeout": 10000000000}`, 200},
		{viewer, "POST", "/v1/vms/" + vm + "/kill", "", 403},
		{admin, "POST", "/v1/up", `{"files": [{"name": "b.toml", "content": "name = 'b'\nmemory = 1\n"}], "adopt": false}`, 500},
		{admin, "GET", "/v1/events?name=" + vm + "&since=2000-01-01T00:00:00Z", "", 200},
		{admin, "GET", "/v1/vms/" + vm + "/logs", "", 200},
		{admin, "POST", "/v1/vms/" + vm + "/vnc-ticket", `{"ttl": 60000000000}`, 200},
		{admin, "GET", "/v1/vms/" + vm + "/console", "", 400}, // not a websocket upgrade
		{admin, "POST", "/v1/vms/" + vm + "/backup", `{"dir": "schema", "incremental": false}`, 200},
	}
	for _, c := range calls {
		h.validate(t, router, c.c, c.method, c.path, c.body, c.status)
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// validate makes one call and checks its answer against the document.
func (h *host) validate(t *testing.T, router interface {
	FindRoute(*http.Request) (*routers.Route, map[string]string, error)
}, c *http.Client, method, path, body string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, h.url+path, strings.NewReader(body))
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Errorf("%s %s: %s, want %d: %s", method, path, resp.Status, status, b)
	}
	route, params, err := router.FindRoute(req)
	if err != nil {
		t.Fatalf("%s %s: no route in openapi.json: %v", method, path, err)
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}}
	if resp.Header.Get("Content-Type") == "application/x-ndjson" {
		h.validateLines(t, route, method+" "+path, b)
		return
	}
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	out.SetBodyBytes(b)
	if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
		t.Errorf("%s %s: the answer does not match openapi.json: %v\n%s", method, path, err, b)
	}
}

// validateLines checks each line of a streamed answer.
func (h *host) validateLines(t *testing.T, route *routers.Route, what string, b []byte) {
	t.Helper()
	schema := route.Operation.Responses.Status(200).Value.Content["application/x-ndjson"].Schema.Value
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 16<<20)
	n := 0
	for sc.Scan() {
		var v any
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatalf("%s: line %d: %v", what, n, err)
		}
		if err := schema.VisitJSON(v); err != nil {
			t.Errorf("%s: line %d does not match openapi.json: %v\n%s", what, n, err, sc.Bytes())
		}
		n++
	}
	if n < 2 {
		t.Errorf("%s: %d lines, want items and the end", what, n)
	}
}

// httpClient is an HTTP client with who's certificate.
func (h *host) httpClient(t *testing.T, who string) *http.Client {
	cert, err := tls.LoadX509KeyPair(h.certs[who][0], h.certs[who][1])
	if err != nil {
		t.Fatal(err)
	}
	pem, err := os.ReadFile(h.pki.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tr := &http.Transport{TLSClientConfig: &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool, MinVersion: tls.VersionTLS13}}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}
