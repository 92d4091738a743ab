package template

// DecodeJSON is the request decoder, for tests that hold it to
// encoding/json's reading of strings.
var DecodeJSON = decodeJSON
