// Package http is wasmbox's HTTP for Go guests: an http.RoundTripper whose requests the host
// makes, only to the hosts the server allows (WASMBOX_ALLOW_HOSTS), through the door. Importing
// it makes it net/http's DefaultTransport, so http.Get and the default client use it:
//
//	import _ "wasmbox/http"
//
// A refused request is an error naming the host and the setting.
package http

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	nethttp "net/http"
	"strconv"
	"unsafe"
)

//go:wasmimport wasmbox call
func hostCall(frame unsafe.Pointer, n int32) int32

//go:wasmimport wasmbox take
func hostTake(buf unsafe.Pointer, n int32) int32

// Error is a request the host did not make, or made without a response.
type Error struct {
	Kind, Message string
}

func (e *Error) Error() string { return "wasmbox: " + e.Message }

// Transport sends requests through the host.
type Transport struct{}

// RoundTrip implements http.RoundTripper.
func (Transport) RoundTrip(req *nethttp.Request) (*nethttp.Response, error) {
	var body []byte
	if req.Body != nil {
		b, err := io.ReadAll(req.Body)
		req.Body.Close()
		if err != nil {
			return nil, err
		}
		body = b
	}
	headers := [][2]string{}
	for k, vs := range req.Header {
		for _, v := range vs {
			headers = append(headers, [2]string{k, v})
		}
	}
	head, err := json.Marshal(map[string]any{"method": req.Method, "url": req.URL.String(), "headers": headers})
	if err != nil {
		return nil, err
	}
	frame := append([]byte("wasmbox:http\n"), head...)
	frame = append(frame, 0)
	frame = append(frame, body...)
	n := hostCall(unsafe.Pointer(&frame[0]), int32(len(frame)))
	if n < 0 {
		return nil, errors.New("wasmbox: the door failed (the request or its answer did not fit)")
	}
	answer := make([]byte, n+1)
	hostTake(unsafe.Pointer(&answer[0]), n)
	answer = answer[:n]
	at := bytes.IndexByte(answer, 0)
	if at < 0 {
		return nil, errors.New("wasmbox: the answer has no head")
	}
	var a struct {
		Status  int         `json:"status"`
		Reason  string      `json:"reason"`
		Headers [][2]string `json:"headers"`
		Error   *Error      `json:"error"`
	}
	if err := json.Unmarshal(answer[:at], &a); err != nil {
		return nil, fmt.Errorf("wasmbox: the answer's head: %w", err)
	}
	if a.Error != nil {
		return nil, a.Error
	}
	h := nethttp.Header{}
	for _, kv := range a.Headers {
		h.Add(kv[0], kv[1])
	}
	rest := answer[at+1:]
	return &nethttp.Response{
		Status:        strconv.Itoa(a.Status) + " " + a.Reason,
		StatusCode:    a.Status,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        h,
		Body:          io.NopCloser(bytes.NewReader(rest)),
		ContentLength: int64(len(rest)),
		Request:       req,
	}, nil
}

func init() {
	nethttp.DefaultTransport = Transport{}
	nethttp.DefaultClient.Transport = Transport{}
}
