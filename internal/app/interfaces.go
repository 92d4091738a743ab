package app

import (
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
)

// Every interface a consumer declares is satisfied by what this package
// wires into it, checked here at compile time so that a changed method
// breaks the build, not a deployment.
var (
	_ router.Index        = (*store.Store)(nil)
	_ router.Registry     = (*store.Store)(nil)
	_ router.Domains      = (*store.Store)(nil)
	_ router.Queue        = (*store.Store)(nil)
	_ router.Pods         = (*store.Store)(nil)
	_ api.Registry        = (*store.Store)(nil)
	_ api.PinRecorder     = (*store.Store)(nil)
	_ ingestor.Store      = (*store.Store)(nil)
	_ ingestor.IndexStore = (*store.Store)(nil)
	_ ingestor.KeyLookup  = (*store.Store)(nil)
	_ ingestor.Transport  = ingestor.ZMQ{}
	_ discovery.Registry  = (*store.Store)(nil)
)

// Capabilities the router finds by type assertion: without these checks a
// renamed method would silently turn reset detection off, or the store's
// model-carrying request ids into random ones.
var (
	_ router.Epocher         = (*store.Store)(nil)
	_ router.RequestIDMinter = (*store.Store)(nil)
)
