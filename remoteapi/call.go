package remoteapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/vmsup/vmsup/internal/vm/vmstore"
	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// call is one request being served.
type call struct {
	s             *Server
	w             http.ResponseWriter
	r             *http.Request
	ctx           context.Context
	id, transport string
	route         string
	audited       bool
	streaming     bool
	// allowed are the VMs allow let the call act on (audited allowed):
	// a refusal by the operation itself is audited again (refusedLater).
	allowed []string
}

// route is one operation of the API. Body and Result are zero values of
// its request and result types (openapi.json is generated from them).
type route struct {
	Pattern string // "POST /v1/vms/{name}/down"
	Summary string
	Body    any  // nil: no body
	Result  any  // nil: null
	Stream  bool // NDJSON of Line[Result]
	Upgrade bool // a websocket session (session.go)
	Long    bool // bounded by stream_timeout, not call_timeout (sessions, backup, migrate)
	Query   []string
	h       func(c *call) (any, error)
}

// httpStatus is the status of an answer with that error kind.
var httpStatus = map[string]int{KindUsage: 400, KindNotFound: 404, KindBusy: 409, KindNotRunning: 409, KindInterrupted: 503,
	KindFailed: 500, KindUnauthorized: 401, KindForbidden: 403, KindTooLarge: 413, KindTooMany: 429}

// wrap serves rt: the caller's identity, its share of calls, the deadline,
// then rt's handler; every call is audited (by allow, else here).
func (s *Server) wrap(rt route) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := &call{s: s, w: w, r: r, route: rt.Pattern}
		c.id, c.transport = identity(r)
		if c.id == "" || !s.Config.known(c.id) {
			c.fail(newError(KindUnauthorized, fmt.Sprintf("vmsup api: %s is granted nothing here (%s)", orNone(c.id), s.Config.path)))
			return
		}
		if !s.enter(c.id) {
			c.fail(newError(KindTooMany, fmt.Sprintf("vmsup api: %s has %d calls in flight already, the most one client may have", c.id, s.Config.MaxCallsPerClient)))
			return
		}
		defer s.leave(c.id)
		timeout := s.Config.CallTimeout
		if rt.Long || (rt.Stream && r.URL.Query().Get("follow") == "true") {
			timeout = s.Config.StreamTimeout
		}
		ctx, cancel := context.WithTimeout(r.Context(), timeout.D())
		defer cancel()
		c.ctx = ctx
		if r.ContentLength > s.Config.MaxRequest {
			c.fail(tooLarge(s.Config.MaxRequest))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.Config.MaxRequest)
		res, err := rt.h(c)
		if c.streaming {
			return
		}
		if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && r.Context().Err() == nil {
			err = newError(KindFailed, fmt.Sprintf("vmsup api: %s: stopped after call_timeout %s (%s): %v", rt.Pattern, timeout.D(), s.Config.path, err))
		}
		if err != nil {
			c.fail(err)
			return
		}
		c.answer(http.StatusOK, res, nil)
	})
}

func orNone(id string) string {
	if id == "" {
		return "a client without an identity"
	}
	return id
}

// fail answers err, auditing the call as refused if nothing audited it.
func (c *call) fail(err error) {
	e := ErrorOf(err)
	if !c.audited {
		c.audited = true
		// Refused before allow named its VMs (a backup's dir, a bad
		// body): the path's VM still says what the call was about.
		var vms []string
		if n := c.name(); n != "" {
			vms = []string{n}
		}
		if aerr := c.s.audit(c.r.Context(), c.entry(Refused, e.Message, vms...)); aerr != nil {
			c.s.Logger.Error("audit", "err", aerr)
		}
	}
	c.refusedLater(err, e)
	c.answer(httpStatus[e.Kind], nil, e)
}

// refusedLater audits a call allow let through as refused when the
// operation refused what it was given on the host's security rules (a path
// outside the host's places, another VM's image): the audit and the
// security log must not say such a call was allowed and leave it there.
func (c *call) refusedLater(err error, e *Error) {
	if c.allowed == nil || !errors.Is(err, supervisor.ErrOutsidePlaces) && !errors.Is(err, supervisor.ErrImageOwned) {
		return
	}
	if aerr := c.s.audit(c.r.Context(), c.entry(Refused, e.Message, c.allowed...)); aerr != nil {
		c.s.Logger.Error("audit", "err", aerr)
	}
	c.allowed = nil
}

// answer writes an Answer.
func (c *call) answer(status int, res any, e *Error) {
	if status == 0 {
		status = 500
	}
	c.w.Header().Set("Content-Type", "application/json")
	writeWithin(c.w)
	c.w.WriteHeader(status)
	json.NewEncoder(c.w).Encode(Answer[any]{Result: res, Error: e})
}

func (c *call) entry(v Verdict, reason string, vms ...string) AuditEntry {
	return AuditEntry{Identity: c.id, Transport: c.transport, Remote: c.r.RemoteAddr, Call: c.route, VMs: vms, Verdict: v, Reason: reason}
}

// allow checks that the caller has role need for every VM of vms and audits
// the call: allowed (before it acts), or refused with why.
func (c *call) allow(need Role, vms ...string) error {
	for _, vm := range vms {
		if err := spec.ValidName(vm); err != nil {
			return newError(KindUsage, fmt.Sprintf("vm %q: %v", vm, err))
		}
		if err := vmstore.NotVM(vm); err != nil {
			return newError(KindNotFound, err.Error()) // vmsup's own unit: never a VM's
		}
	}
	var refusal *Error
	for _, vm := range vms {
		if have := c.s.Config.RoleFor(c.id, vm); !have.allows(need) {
			refusal = newError(KindForbidden, fmt.Sprintf("vm %q: %s may not %s: it needs role %s, %s has %s for this VM",
				vm, c.id, c.verb(), need, c.id, orNoRole(have)))
			break
		}
	}
	c.audited = true
	if refusal != nil {
		if err := c.s.audit(c.ctx, c.entry(Refused, refusal.Message, vms...)); err != nil {
			c.s.Logger.Error("audit", "err", err)
		}
		return refusal
	}
	if err := c.s.audit(c.ctx, c.entry(Allowed, "", vms...)); err != nil {
		return fmt.Errorf("vmsup api: audit log: %w (the call was not made)", err)
	}
	c.allowed = append([]string{}, vms...)
	return nil
}

func orNoRole(r Role) string {
	if r == "" {
		return "no role"
	}
	return string(r)
}

// verb is what the call does, for messages: "POST /v1/vms/{name}/down" ->
// "down".
func (c *call) verb() string {
	_, p, _ := strings.Cut(c.route, " ")
	parts := strings.Split(strings.Trim(p, "/"), "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if !strings.HasPrefix(parts[i], "{") && parts[i] != Version {
			return parts[i]
		}
	}
	return p
}

// may reports whether the caller has role need for vm (listings filter by
// it).
func (c *call) may(need Role, vm string) bool { return c.s.Config.RoleFor(c.id, vm).allows(need) }

// tooLarge is the refusal of a body over max bytes.
func tooLarge(max int64) error {
	return newError(KindTooLarge, fmt.Sprintf("vmsup api: request body over %d bytes, the most this server reads (max_request)", max))
}

// decode reads the request's JSON body into T. The body has bodyTimeout
// to arrive: a client trickling it is cut off (its connection's read
// deadline passes) rather than holding its call, and the server, up.
func decode[T any](c *call) (T, error) {
	var v T
	rc := http.NewResponseController(c.w)
	late := time.AfterFunc(bodyTimeout, func() { rc.SetReadDeadline(time.Now()) })
	dec := json.NewDecoder(c.r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(&v)
	if !late.Stop() {
		c.w.Header().Set("Connection", "close")
		return v, newError(KindUsage, fmt.Sprintf("vmsup api: request body: not received within %s (a client sends its body at once)", bodyTimeout))
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return v, tooLarge(mbe.Limit)
		}
		return v, newError(KindUsage, fmt.Sprintf("vmsup api: request body: %v", err))
	}
	return v, nil
}

// stream answers NDJSON: run emits items; the last line is the end with
// run's error.
func stream[T any](c *call, run func(emit func(T) error) error) error {
	c.streaming, c.audited = true, true
	c.w.Header().Set("Content-Type", "application/x-ndjson")
	rc := writeWithin(c.w)
	c.w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(c.w)
	err := run(func(v T) error {
		rc.SetWriteDeadline(time.Now().Add(writeTimeout))
		if err := enc.Encode(Line[T]{Item: &v}); err != nil {
			return err
		}
		return rc.Flush()
	})
	rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	enc.Encode(Line[T]{End: true, Err: ErrorOf(err)})
	rc.Flush()
	return nil
}

// writeWithin gives the next write to w writeTimeout to reach the client;
// a stream moves the deadline with each line on the controller returned.
func writeWithin(w http.ResponseWriter) *http.ResponseController {
	rc := http.NewResponseController(w)
	rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	return rc
}

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }
