// Package errorx turns the service's errors into JSON responses.
package errorx

import (
	"context"
	"errors"
	"net/http"
)

// CodeError is an error to answer with its HTTP status Code.
type CodeError struct {
	Code int
	Msg  string
}

func (e *CodeError) Error() string { return e.Msg }

// Body is the JSON body of an error response.
type Body struct {
	Error string `json:"error"`
}

// Handler is the service's httpx error handler: a CodeError is answered
// with its code, the end of the request's context (go-zero's timeout) with
// 503, anything else (a request that httpx.Parse refused) with 400.
func Handler(_ context.Context, err error) (int, any) {
	var ce *CodeError
	switch {
	case errors.As(err, &ce):
		return ce.Code, Body{Error: ce.Msg}
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusServiceUnavailable, Body{Error: "timed out: retry"}
	}
	return http.StatusBadRequest, Body{Error: err.Error()}
}
