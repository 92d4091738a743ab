package api

import "reflect"

// DecodeRouteRequestUnspliced decodes a /v1/route body the way
// DecodeRouteRequest did before its scan parsed the token ids itself: the
// strict scan, then encoding/json over the whole body. The tests hold the
// two to the same answers and errors.
func DecodeRouteRequestUnspliced(body []byte) (RouteRequest, error) {
	var req RouteRequest
	if err := checkBody(body, jsonFields(reflect.TypeOf(req)), true); err != nil {
		return req, err
	}
	err := decodeJSON(body, &req)
	return req, err
}
