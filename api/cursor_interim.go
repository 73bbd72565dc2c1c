package api

import (
	"encoding/base64"
	"strings"
)

// interimCursors is the stand-in CursorCodec until the shared signed cursor codec of
// docs/api-contract.md §9.2 is wired in (Config.Cursors): the scope and the position, base64url.
// It keeps cursors scoped (one of another list does not decode) but does not sign them.
type interimCursors struct{}

func (interimCursors) Encode(scope string, position []byte) string {
	return base64.RawURLEncoding.EncodeToString(append([]byte(scope+"|"), position...))
}

func (interimCursors) Decode(scope, cursor string) ([]byte, error) {
	b, err := base64.RawURLEncoding.DecodeString(cursor)
	if err != nil {
		return nil, errCursor
	}
	pos, ok := strings.CutPrefix(string(b), scope+"|")
	if !ok {
		return nil, errCursor
	}
	return []byte(pos), nil
}
