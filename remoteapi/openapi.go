package remoteapi

import _ "embed"

// OpenAPI is the API's OpenAPI 3 document, served at GET /v1/openapi.json
// and checked in as remoteapi/openapi.json (generated from Routes and the
// Go types by TestOpenAPIGolden -update).
//
//go:embed openapi.json
var OpenAPI []byte
