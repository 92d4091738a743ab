package api

import (
	"context"
	"fmt"
	"reflect"

	"github.com/kvroute/kvroute/internal/strictjson"
	"github.com/kvroute/kvroute/router"
)

// RouteFunc is Router.Route's signature.
type RouteFunc func(context.Context, router.Request) (router.Decision, error)

// WithRoute stands f in for the router's Route in c's server; next is
// the router's own. The router's queue is not on main yet (and not the
// API's to test): this is how the tests see what a request asked of it
// and answer as the queue will (a wait, a *router.ShedError).
func WithRoute(c *Config, f func(ctx context.Context, req router.Request, next RouteFunc) (router.Decision, error)) {
	next := c.Router.Route
	c.route = func(ctx context.Context, req router.Request) (router.Decision, error) { return f(ctx, req, next) }
}

// DecodeRouteRequestUnspliced decodes a /v1/route body the way
// DecodeRouteRequest did before its scan parsed the token ids itself: the
// strict scan, then encoding/json over the whole body. The tests hold the
// two to the same answers and errors.
func DecodeRouteRequestUnspliced(body []byte) (RouteRequest, error) {
	var req RouteRequest
	if err := strictjson.Check(body, strictjson.Fields(reflect.TypeOf(req)), true); err != nil {
		return req, err
	}
	err := decodeJSON(body, &req)
	return req, err
}

// ProxyDecodeParity decodes an OpenAI body the way the proxy does and the
// way it did before its scan took the large fields, and describes any
// difference ("" when they agree).
func ProxyDecodeParity(body []byte) string {
	var got, want openAIRequest
	gotErr := decodeWith(body, &got, openAIFields, false, unmarshalJSON)
	wantErr := strictjson.Check(body, openAIFields, false)
	if wantErr == nil {
		wantErr = unmarshalJSON(body, &want)
	}
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		return fmt.Sprintf("error = %v, want %v", gotErr, wantErr)
	}
	if gotErr == nil && !reflect.DeepEqual(got, want) {
		return fmt.Sprintf("decoded %+v, want %+v", got, want)
	}
	return ""
}
