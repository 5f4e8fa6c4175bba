package main

import (
	"github.com/vmsup/vmsup/supervisor"
)

type agentJSON struct {
	Name       string        `json:"name"`
	Responding bool          `json:"responding"`
	Version    string        `json:"version"`
	OS         string        `json:"os"`
	PingMillis float64       `json:"ping_ms"`
	Error      string        `json:"error"`
	Addresses  []addressJSON `json:"addresses"`
}

type addressJSON struct {
	Interface string `json:"interface"`
	MAC       string `json:"mac"`
	Address   string `json:"address"`
}

func toAgentJSON(name string, a supervisor.AgentStatus) agentJSON {
	out := agentJSON{Name: name, Responding: a.Responding, Version: a.Version, OS: a.OS, PingMillis: a.PingMillis, Error: a.Error, Addresses: []addressJSON{}}
	for _, ad := range a.Addresses {
		out.Addresses = append(out.Addresses, addressJSON{Interface: ad.Interface, MAC: ad.MAC, Address: ad.Address})
	}
	return out
}

// resizeJSON is set's result in --json.
type resizeJSON struct {
	Name      string `json:"name"`
	CPUs      int    `json:"cpus"`
	MaxCPUs   int    `json:"max_cpus"`
	Memory    string `json:"memory"`
	MaxMemory string `json:"max_memory"`
	Note      string `json:"note"`
}
