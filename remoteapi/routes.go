package remoteapi

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/vmsup/vmsup/spec"
	"github.com/vmsup/vmsup/supervisor"
)

// Handler serves the API's routes (Routes).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	for _, rt := range s.Routes() {
		mux.Handle(rt.Pattern, s.wrap(rt))
	}
	mux.Handle("/", s.wrap(route{Pattern: "/", h: func(c *call) (any, error) {
		return nil, newError(KindNotFound, fmt.Sprintf("vmsup api: no route %s %s (this server speaks %s: GET /%s/openapi.json)", c.r.Method, c.r.URL.Path, Version, Version))
	}}))
	return mux
}

// Routes are the API's operations, each calling the Ops method of the
// same name.
func (s *Server) Routes() []route {
	rs := append(s.readRoutes(), s.actRoutes()...)
	return append(append(rs, s.sessionRoutes()...), s.longRoutes()...)
}

func (s *Server) readRoutes() []route {
	return []route{
		{Pattern: "GET /v1/openapi.json", Summary: "This API's OpenAPI document", h: func(c *call) (any, error) {
			if err := c.allow(ReadOnly); err != nil {
				return nil, err
			}
			c.streaming = true
			c.w.Header().Set("Content-Type", "application/json")
			writeWithin(c.w)
			_, err := c.w.Write(OpenAPI)
			return nil, err
		}},
		{Pattern: "GET /v1/vms", Summary: "list: every VM the caller may read, with its status", Result: []supervisor.Status{}, h: func(c *call) (any, error) {
			if err := c.allow(ReadOnly); err != nil {
				return nil, err
			}
			sts, err := s.Ops.List(c.ctx)
			out := []supervisor.Status{}
			for _, st := range sts {
				if c.may(ReadOnly, st.Name) {
					out = append(out, st)
				}
			}
			return out, err
		}},
		{Pattern: "GET /v1/names", Summary: "the names of the VMs the caller may read", Result: []string{}, h: func(c *call) (any, error) {
			if err := c.allow(ReadOnly); err != nil {
				return nil, err
			}
			return s.readable(c)
		}},
		{Pattern: "GET /v1/vms/{name}", Summary: "status", Result: supervisor.Status{}, h: func(c *call) (any, error) {
			return vmCall(c, ReadOnly, s.Ops.Status)
		}},
		{Pattern: "GET /v1/vms/{name}/spec", Summary: "the spec the VM last ran (restart NAME)", Result: AppliedSpec{}, h: func(c *call) (any, error) {
			if err := c.allow(ReadOnly, c.name()); err != nil {
				return nil, err
			}
			f, err := s.Ops.AppliedSpec(c.name())
			if err != nil {
				return nil, err
			}
			return AppliedSpec{Path: f.Path, Content: string(f.Raw)}, nil
		}},
		{Pattern: "POST /v1/plan", Summary: "plan a submitted file", Body: PlanRequest{}, Result: supervisor.PlanResult{}, h: s.plan},
		{Pattern: "GET /v1/stats", Summary: "figures of the VMs named (name=, repeated), or of every VM the caller may read", Query: []string{"name"}, Result: StatsResult{}, h: s.stats},
		{Pattern: "GET /v1/events", Summary: "events of the VMs named (name=), or of every VM the caller may read; since= (RFC 3339), follow=true", Query: []string{"name", "since", "follow"}, Result: supervisor.Event{}, Stream: true, h: s.events},
		{Pattern: "GET /v1/vms/{name}/logs", Summary: "console log and journal; since= (RFC 3339), follow=true", Query: []string{"since", "follow"}, Result: supervisor.LogLine{}, Stream: true, h: s.logs},
		{Pattern: "GET /v1/vms/{name}/snapshots", Summary: "snapshot ls", Result: supervisor.SnapshotTree{}, h: func(c *call) (any, error) {
			if err := c.allow(ReadOnly, c.name()); err != nil {
				return nil, err
			}
			return s.Ops.SnapshotTree(c.name())
		}},
	}
}

func (s *Server) actRoutes() []route {
	return []route{
		{Pattern: "POST /v1/up", Summary: "up: start the VMs of submitted files", Body: UpRequest{}, Result: []supervisor.UpResult{}, h: s.up},
		{Pattern: "POST /v1/apply", Summary: "apply a submitted file to its running VM", Body: ApplyRequest{}, Result: supervisor.ApplyResult{}, h: s.apply},
		{Pattern: "POST /v1/vms/{name}/restart", Summary: "restart, with a submitted file or the spec the VM last ran", Body: RestartRequest{}, Result: supervisor.UpResult{}, h: s.restart},
		{Pattern: "POST /v1/vms/{name}/down", Summary: "down", Body: DownRequest{}, Result: supervisor.DownResult{}, h: func(c *call) (any, error) {
			req, err := decode[DownRequest](c)
			if err != nil {
				return nil, err
			}
			return vmCall(c, Operator, func(ctx ctxT, name string) (supervisor.DownResult, error) {
				return s.Ops.DownWith(ctx, name, supervisor.DownOptions{Timeout: req.Timeout, Force: req.Force})
			})
		}},
		{Pattern: "POST /v1/vms/{name}/kill", Summary: "kill", Result: supervisor.DownResult{}, h: func(c *call) (any, error) { return vmCall(c, Operator, s.Ops.Kill) }},
		{Pattern: "POST /v1/vms/{name}/reboot", Summary: "reboot", Body: RebootRequest{}, Result: supervisor.RebootResult{}, h: func(c *call) (any, error) {
			req, err := decode[RebootRequest](c)
			if err != nil {
				return nil, err
			}
			return vmCall(c, Operator, func(ctx ctxT, name string) (supervisor.RebootResult, error) { return s.Ops.Reboot(ctx, name, req.Mode) })
		}},
		{Pattern: "POST /v1/vms/{name}/reset", Summary: "reset", h: func(c *call) (any, error) { return vmDo(c, Operator, s.Ops.Reset) }},
		{Pattern: "POST /v1/vms/{name}/pause", Summary: "pause", h: func(c *call) (any, error) { return vmDo(c, Operator, s.Ops.Pause) }},
		{Pattern: "POST /v1/vms/{name}/resume", Summary: "resume", h: func(c *call) (any, error) { return vmDo(c, Operator, s.Ops.Resume) }},
		{Pattern: "POST /v1/vms/{name}/snapshots", Summary: "snapshot create", Body: SnapshotRequest{}, Result: supervisor.SnapshotResult{}, h: func(c *call) (any, error) {
			req, err := decode[SnapshotRequest](c)
			if err != nil {
				return nil, err
			}
			return vmCall(c, Operator, func(ctx ctxT, name string) (supervisor.SnapshotResult, error) {
				return s.Ops.Snapshot(ctx, name, req.Tag, supervisor.SnapshotOptions{Memory: req.Memory})
			})
		}},
		{Pattern: "POST /v1/vms/{name}/snapshots/{tag}/revert", Summary: "snapshot revert", Body: RevertRequest{}, Result: supervisor.RevertResult{}, h: func(c *call) (any, error) {
			req, err := decode[RevertRequest](c)
			if err != nil {
				return nil, err
			}
			return vmCall(c, Operator, func(ctx ctxT, name string) (supervisor.RevertResult, error) {
				return s.Ops.RevertSnapshot(ctx, name, c.r.PathValue("tag"), req.Force)
			})
		}},
		{Pattern: "DELETE /v1/vms/{name}/snapshots/{tag}", Summary: "snapshot rm", h: func(c *call) (any, error) {
			return vmDo(c, Operator, func(ctx ctxT, name string) error { return s.Ops.RemoveSnapshot(ctx, name, c.r.PathValue("tag"), nil) })
		}},
		{Pattern: "POST /v1/vms/{name}/exec", Summary: "run a command in the guest (guest agent)", Body: ExecRequest{}, Result: supervisor.ExecResult{}, h: func(c *call) (any, error) {
			req, err := decode[ExecRequest](c)
			if err != nil {
				return nil, err
			}
			if len(req.Argv) == 0 {
				return nil, newError(KindUsage, "exec: argv is empty")
			}
			return vmCall(c, Admin, func(ctx ctxT, name string) (supervisor.ExecResult, error) {
				return s.Ops.Exec(ctx, name, req.Argv, req.Timeout)
			})
		}},
	}
}

// name is the VM of the route's path.
func (c *call) name() string { return c.r.PathValue("name") }

// vmCall runs op on the path's VM once the caller has role need for it.
func vmCall[T any](c *call, need Role, op func(ctxT, string) (T, error)) (any, error) {
	if err := c.allow(need, c.name()); err != nil {
		return nil, err
	}
	return op(c.ctx, c.name())
}

// vmDo is vmCall for an op without a result.
func vmDo(c *call, need Role, op func(ctxT, string) error) (any, error) {
	return vmCall(c, need, func(ctx ctxT, name string) (any, error) { return nil, op(ctx, name) })
}

// readable are the VMs the caller may read.
func (s *Server) readable(c *call) ([]string, error) {
	names, err := s.Ops.Names()
	out := []string{}
	for _, n := range names {
		if c.may(ReadOnly, n) {
			out = append(out, n)
		}
	}
	return out, err
}

// named are the VMs of the query's name=, or every one the caller may read.
func (s *Server) named(c *call) ([]string, error) {
	if names := c.r.URL.Query()["name"]; len(names) > 0 {
		return names, c.allow(ReadOnly, names...)
	}
	if err := c.allow(ReadOnly); err != nil {
		return nil, err
	}
	return s.readable(c)
}

func (s *Server) stats(c *call) (any, error) {
	names, err := s.named(c)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return StatsResult{VMs: []supervisor.VMStats{}, Skipped: []supervisor.StatsSkipped{}}, nil
	}
	vms, skipped, err := s.Ops.Stats(c.ctx, names...)
	return StatsResult{VMs: vms, Skipped: skipped}, err
}

// since reads the query's since= and follow=.
func since(c *call) (time.Time, bool, error) {
	q := c.r.URL.Query()
	var t time.Time
	if v := q.Get("since"); v != "" {
		var err error
		if t, err = time.Parse(time.RFC3339Nano, v); err != nil {
			return t, false, newError(KindUsage, fmt.Sprintf("since=%q: want an RFC 3339 time", v))
		}
	}
	return t, q.Get("follow") == "true", nil
}

func (s *Server) events(c *call) (any, error) {
	from, follow, err := since(c)
	if err != nil {
		return nil, err
	}
	names, err := s.named(c)
	if err != nil {
		return nil, err
	}
	return nil, stream(c, func(emit func(supervisor.Event) error) error {
		return s.Ops.FollowEvents(c.ctx, names, from, follow, func(e supervisor.Event) error {
			if e.Data == nil {
				e.Data = map[string]any{} // as vmsup events --json prints it
			}
			return emit(e)
		})
	})
}

func (s *Server) logs(c *call) (any, error) {
	from, follow, err := since(c)
	if err != nil {
		return nil, err
	}
	if err := c.allow(ReadOnly, c.name()); err != nil {
		return nil, err
	}
	return nil, stream(c, func(emit func(supervisor.LogLine) error) error {
		var werr error
		err := s.Ops.Logs(c.ctx, c.name(), supervisor.LogOptions{Since: from, Follow: follow}, func(l supervisor.LogLine) {
			if werr == nil {
				werr = emit(l)
			}
		})
		return errors.Join(err, werr)
	})
}

// adoptRole is the role a call needs: taking a VM over from its file on
// the host (adopt) is the admin's.
func adoptRole(need Role, adopt bool) Role {
	if adopt {
		return Admin
	}
	return need
}

func (s *Server) up(c *call) (any, error) {
	req, err := decode[UpRequest](c)
	if err != nil {
		return nil, err
	}
	var fs []*spec.File
	var errs []error
	for _, f := range req.Files {
		p, err := s.parse(f)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		fs = append(fs, p)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	var names []string
	for _, f := range fs {
		names = append(names, f.VM.Name)
	}
	if err := c.allow(adoptRole(Operator, req.Adopt), names...); err != nil {
		return nil, err
	}
	for _, f := range fs {
		if err := s.keep(f); err != nil {
			return nil, err
		}
	}
	res, err := s.Ops.UpWith(c.ctx, supervisor.UpOptions{Adopt: req.Adopt}, fs...)
	if res == nil {
		res = []supervisor.UpResult{}
	}
	return c.partial(res, err)
}

// partial answers a result together with an error (up's results so far).
func (c *call) partial(res any, err error) (any, error) {
	if err == nil {
		return res, nil
	}
	e := ErrorOf(err)
	c.refusedLater(err, e)
	c.streaming = true
	c.answer(httpStatus[e.Kind], res, e)
	return nil, nil
}

func (s *Server) plan(c *call) (any, error) {
	req, err := decode[PlanRequest](c)
	if err != nil {
		return nil, err
	}
	f, err := s.parse(req.File)
	if err != nil {
		return nil, err
	}
	if err := c.allow(ReadOnly, f.VM.Name); err != nil {
		return nil, err
	}
	res, err := s.Ops.PlanWith(c.ctx, f, supervisor.PlanOptions{Adopt: req.Adopt})
	return c.partial(res, err)
}

func (s *Server) apply(c *call) (any, error) {
	req, err := decode[ApplyRequest](c)
	if err != nil {
		return nil, err
	}
	f, err := s.parse(req.File)
	if err != nil {
		return nil, err
	}
	if err := c.allow(adoptRole(Operator, req.Adopt), f.VM.Name); err != nil {
		return nil, err
	}
	if err := s.keep(f); err != nil {
		return nil, err
	}
	res, err := s.Ops.Apply(c.ctx, f, supervisor.ApplyOptions{Restart: req.Restart, AtNextReboot: req.AtNextReboot, Adopt: req.Adopt})
	return c.partial(res, err)
}

func (s *Server) restart(c *call) (any, error) {
	req, err := decode[RestartRequest](c)
	if err != nil {
		return nil, err
	}
	if err := c.allow(Operator, c.name()); err != nil {
		return nil, err
	}
	var f *spec.File
	if req.File != nil {
		if f, err = s.parse(*req.File); err == nil && f.VM.Name != c.name() {
			err = newError(KindUsage, fmt.Sprintf("restart %s: the file defines VM %q", c.name(), f.VM.Name))
		}
		if err == nil {
			err = s.keep(f)
		}
	} else {
		f, err = s.Ops.AppliedSpec(c.name())
	}
	if err != nil {
		return nil, err
	}
	res, err := s.Ops.Restart(c.ctx, f)
	return c.partial(res, err)
}
