// Package deps pins the project's modules in go.mod while packages are being
// written in parallel; it is removed once every module has a real importer.
package deps

import (
	_ "github.com/alicebob/miniredis/v2"
	_ "github.com/fxamacker/cbor/v2"
	_ "github.com/go-chi/chi/v5"
	_ "github.com/go-zeromq/zmq4"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/vmihailenco/msgpack/v5"
)
