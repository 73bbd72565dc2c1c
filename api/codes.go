package api

import (
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/danielgtaylor/huma/v2"
)

// Error codes in the document (docs/api-contract.md §1, §17)
//
// Every error response an operation declares lists, as the enum of its code, exactly the
// codes that operation can send with that status. The declaration lives with the operation:
//
//   - Server.operation declares each status of its errs list with the status's usual code
//     (codeByStatus): 401 unauthorized, 404 not_found, … A status whose code is always the same
//     needs nothing more; a new such status gets its code in codeByStatus.
//   - Anything else an operation can send is declared with answers, before huma.Register:
//
//     op := answers(s.operation(http.MethodDelete, …), http.StatusConflict, CodeImportFinished)
//
//     idempotent does so for the codes of Idempotency-Key; create and update for
//     email_already_subscribed.
//
// documentErrors then writes each error response's schema from these declarations (an
// operation built without Server.operation gets the usual code of each status), drops the
// responses Huma adds that an operation never sends, and lists every code in Error's code
// description. The integration suite checks the declarations against what the server really
// answers: every (status, code) its tests receive must be declared for that operation
// (integration/traffic_test.go), so an undeclared code fails the suite.

// metaCodes is operation metadata: map[int][]string, the codes each error status may carry.
const metaCodes = "error_codes"

// answers declares that op may answer status with each of codes, and returns it.
func answers(op huma.Operation, status int, codes ...string) huma.Operation {
	if op.Metadata == nil {
		op.Metadata = map[string]any{}
	}
	m, _ := op.Metadata[metaCodes].(map[int][]string)
	if m == nil {
		m = map[int][]string{}
		op.Metadata[metaCodes] = m
	}
	for _, c := range codes {
		if !slices.Contains(m[status], c) {
			m[status] = append(m[status], c)
		}
	}
	if !slices.Contains(op.Errors, status) {
		op.Errors = append(op.Errors, status)
	}
	return op
}

// answersUsual is answers with the usual code of each status (codeByStatus).
func answersUsual(op huma.Operation, statuses ...int) huma.Operation {
	for _, st := range statuses {
		op = answers(op, st, codeByStatus[st])
	}
	return op
}

// documentErrors writes every error response's schema from the operation's declared codes:
// the envelope (Error; ValidationError on 422, RateLimitError on 429, which type their
// errors member) narrowed to those codes. A response no code is declared for is one Huma
// added and the operation never sends (422 on an operation without a body, for example): it
// is dropped.
func (s *Server) documentErrors() {
	oapi := s.api.OpenAPI()
	reg := oapi.Components.Schemas
	base := map[int]*huma.Schema{
		http.StatusUnprocessableEntity: reg.Schema(reflect.TypeFor[ValidationError](), true, ""),
		http.StatusTooManyRequests:     reg.Schema(reflect.TypeFor[RateLimitError](), true, ""),
	}
	generic := reg.Schema(reflect.TypeFor[Error](), true, "")
	all := map[string][]int{} // every code, with the statuses it comes with
	for _, p := range oapi.Paths {
		for _, op := range []*huma.Operation{p.Get, p.Post, p.Put, p.Patch, p.Delete} {
			if op == nil {
				continue
			}
			declared, _ := op.Metadata[metaCodes].(map[int][]string)
			for code, resp := range op.Responses {
				status, err := strconv.Atoi(code)
				if err != nil || status < 400 {
					continue
				}
				codes := declared[status]
				if declared == nil { // built without Server.operation: the usual codes
					codes = []string{codeByStatus[status]}
				}
				if len(codes) == 0 || codes[0] == "" {
					delete(op.Responses, code)
					continue
				}
				enum := make([]any, len(codes))
				for i, c := range slices.Sorted(slices.Values(codes)) {
					enum[i] = c
					if !slices.Contains(all[c], status) {
						all[c] = append(all[c], status)
					}
				}
				envelope := generic
				if b := base[status]; b != nil {
					envelope = b
				}
				resp.Content = map[string]*huma.MediaType{"application/json": {Schema: &huma.Schema{
					AllOf: []*huma.Schema{envelope, {Type: huma.TypeObject, Properties: map[string]*huma.Schema{
						"code": {Type: huma.TypeString, Enum: enum,
							Description: "The codes this operation answers with this status."},
					}}},
				}}}
			}
			// A status declared with answers after Huma built the responses has none yet.
			for status := range declared {
				if _, ok := op.Responses[strconv.Itoa(status)]; !ok {
					panic("api: " + op.OperationID + " declares codes for status " + strconv.Itoa(status) +
						" after registration; declare them with answers before huma.Register")
				}
			}
		}
	}
	var list []string
	for _, c := range slices.Sorted(maps.Keys(all)) {
		statuses := make([]string, len(all[c]))
		for i, st := range slices.Sorted(slices.Values(all[c])) {
			statuses[i] = strconv.Itoa(st)
		}
		list = append(list, "`"+c+"` ("+strings.Join(statuses, ", ")+")")
	}
	desc := "Machine-readable error code. Each error response of each operation lists the codes it can carry; " +
		"all of them, with their statuses: " + strings.Join(list, ", ") + "."
	for _, name := range []string{"Error", "ValidationError", "RateLimitError"} {
		if sc := reg.Map()[name]; sc != nil && sc.Properties["code"] != nil {
			sc.Properties["code"].Description = desc
		}
	}
}
