package api

import (
	"fmt"
	"reflect"

	"github.com/kvroute/kvroute/internal/strictjson"
)

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
