package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/kvroute/kvroute"
)

// ReplicaList is the answer of GET /v1/replicas.
type ReplicaList struct {
	Replicas []ReplicaView `json:"replicas"`
}

// SourceRegistered is the source the API shows for a replica registered by
// hand (PUT /v1/replicas, --replicas-file), whose Source is empty.
const SourceRegistered = "registered"

// ReplicaView is a registry entry as the API shows it: the entry
// (flattened), with how it was found and where it is in its lifecycle
// always spelled out, since an operator reading a fleet that discovery
// changes must not have to know that an absent field means "registered"
// or "serving". The two fields shadow the entry's own.
type ReplicaView struct {
	kvroute.Replica
	// Source is SourceRegistered or the discovery source that wrote it
	// ("dns:<name>", "k8s:<namespace>/<service>").
	Source string `json:"source"`
	// State is serving, terminating or gone.
	State string `json:"state"`
}

func viewOf(r kvroute.Replica) ReplicaView {
	v := ReplicaView{Replica: r, Source: r.Source, State: r.State.String()}
	if v.Source == "" {
		v.Source = SourceRegistered
	}
	return v
}

// ReplicaDetail is the answer of GET /v1/replicas/{id}: the registry entry
// (flattened) plus what the index and the load counters say about it, which
// is what an operator needs to see why a replica does or does not win.
type ReplicaDetail struct {
	ReplicaView
	Routable bool `json:"routable"`
	// Blocks is how many blocks the index holds for the replica.
	Blocks int `json:"blocks"`
	// AppliedSeq is the last event batch applied; absent until the
	// replica's first batch (and always for replicas without events).
	AppliedSeq  *int64        `json:"applied_seq,omitempty"`
	LastApplied time.Time     `json:"last_applied,omitzero"`
	Load        *kvroute.Load `json:"load,omitempty"`
	// Ranks is a data-parallel replica's engines, each its own cache and
	// load (rankDetails); absent for a replica of one engine.
	Ranks []ReplicaDetail `json:"ranks,omitempty"`
}

func (s *Server) listReplicas(w http.ResponseWriter, r *http.Request) {
	list, err := s.reg.ListReplicas(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if list == nil {
		list = []kvroute.Replica{}
	}
	slices.SortFunc(list, func(a, b kvroute.Replica) int { return strings.Compare(a.ID, b.ID) })
	views := make([]ReplicaView, len(list))
	for i, rep := range list {
		views[i] = viewOf(rep)
	}
	writeJSON(w, http.StatusOK, ReplicaList{Replicas: views})
}

func (s *Server) getReplica(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	rep, err := s.lookupReplica(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	st, err := s.reg.Stats(ctx, rep.Model, rep.ID)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	loads, err := s.reg.Loads(ctx, rep.Model, []string{rep.ID})
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	d := ReplicaDetail{ReplicaView: viewOf(rep), Routable: rep.Routable(), Blocks: st.Blocks, LastApplied: st.LastApplied}
	if st.HasSeq {
		d.AppliedSeq = &st.AppliedSeq
	}
	if len(loads) == 1 {
		d.Load = &loads[0]
	}
	if d.Ranks, err = s.rankDetails(ctx, rep); err != nil {
		s.writeError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, d)
}

// rankDetails is what the index and the load counters say of each of
// rep's data-parallel engines (kvroute.Replica.Engines): each engine is
// indexed and loaded as a replica of its own.
func (s *Server) rankDetails(ctx context.Context, rep kvroute.Replica) ([]ReplicaDetail, error) {
	if rep.Ranks() <= 1 {
		return nil, nil
	}
	engines := rep.Engines()
	ids := make([]string, len(engines))
	for i, e := range engines {
		ids[i] = e.ID
	}
	loads, err := s.reg.Loads(ctx, rep.Model, ids)
	if err != nil {
		return nil, err
	}
	out := make([]ReplicaDetail, len(engines))
	for i, e := range engines {
		st, err := s.reg.Stats(ctx, rep.Model, e.ID)
		if err != nil {
			return nil, err
		}
		out[i] = ReplicaDetail{Replica: e, Routable: e.Routable(), Blocks: st.Blocks, LastApplied: st.LastApplied}
		if st.HasSeq {
			out[i].AppliedSeq = &st.AppliedSeq
		}
		if len(loads) == len(engines) {
			out[i].Load = &loads[i]
		}
	}
	return out, nil
}

// putReplica registers or replaces a replica. The path names the resource,
// so a body id is optional but must agree with it.
func (s *Server) putReplica(w http.ResponseWriter, r *http.Request) {
	id := chi.URLParam(r, "id")
	var rep kvroute.Replica
	if err := s.decodeStrict(w, r, &rep); err != nil {
		s.writeError(w, r, err)
		return
	}
	// What GET shows for a hand-registered, serving replica is what the
	// registry stores as empty, so that a GET's answer can be PUT back.
	if rep.Source == SourceRegistered {
		rep.Source = ""
	}
	if rep.State == "serving" {
		rep.State = kvroute.StateServing
	}
	switch {
	case rep.ID == "":
		rep.ID = id
	case rep.ID != id:
		s.writeError(w, r, &kvroute.FieldError{Field: "id", Msg: fmt.Sprintf("%q does not match the path's %q", rep.ID, id)})
		return
	}
	if err := rep.Validate(); err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.cfg.ReplicaPolicy.Check(rep); err != nil {
		s.writeError(w, r, err)
		return
	}
	status := http.StatusOK
	if _, err := s.reg.GetReplica(r.Context(), id); errors.Is(err, kvroute.ErrNotFound) {
		status = http.StatusCreated
	} else if err != nil {
		s.writeError(w, r, err)
		return
	}
	if err := s.reg.PutReplica(r.Context(), rep); err != nil {
		s.writeError(w, r, err)
		return
	}
	// This pod sees its own write at once; other pods within RegistryTTL.
	s.rt.Invalidate()
	writeJSON(w, status, viewOf(rep))
}

func (s *Server) deleteReplica(w http.ResponseWriter, r *http.Request) {
	if err := s.reg.DeleteReplica(r.Context(), chi.URLParam(r, "id")); err != nil {
		s.writeError(w, r, replicaNotFound(err))
		return
	}
	s.rt.Invalidate()
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) lookupReplica(r *http.Request) (kvroute.Replica, error) {
	rep, err := s.reg.GetReplica(r.Context(), chi.URLParam(r, "id"))
	return rep, replicaNotFound(err)
}

func replicaNotFound(err error) error {
	if errors.Is(err, kvroute.ErrNotFound) {
		return withCode(CodeReplicaNotFound, err)
	}
	return err
}
