// Package cursor makes and checks the opaque pagination cursors of the API
// (docs/api-contract.md §9.2): a position in a keyset order, bound to what the cursor was made
// for, and signed so that a client can neither forge nor alter one.
//
// A cursor is base64url (no padding) of: a version byte, the position (8 bytes of Unix
// microseconds, 16 bytes of id) and the first 16 bytes of HMAC-SHA256(key, binding ‖ version ‖
// position). The binding is not in the cursor, only in its MAC: it names the listing and
// everything a cursor must agree with (operation, newsletter, filters), for example
// "subscribers\x00<newsletter id>\x00<status>\x00<email key>". A cursor decoded with any other
// binding, or under another key, is invalid.
//
// Using it for a new listing (for example a subscriber's event history):
//
//	codec := cursor.New(key)
//	next := codec.Encode(cursor.Binding("events", nl.String(), subscriberID.String()), cursor.Position{...})
//	pos, err := codec.Decode(cursor.Binding("events", nl.String(), subscriberID.String()), given)
//	// err is cursor.ErrInvalid: answer 400 "The cursor is invalid."
//
// The key: cmd/subscriberd reads it from the database (repo.Secret "cursor"), made once by the
// first instance, so cursors made by one instance work on every other and across restarts.
package cursor

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"strings"
	"time"

	"github.com/google/uuid"
)

// ErrInvalid is returned for a cursor that is malformed, altered, or made for another binding
// or key.
var ErrInvalid = errors.New("invalid cursor")

// Position is a place in a keyset order: a time (kept to the microsecond) and an id.
type Position struct {
	Time time.Time
	ID   uuid.UUID
}

const (
	version    = 1
	posLen     = 8 + 16
	macLen     = 16
	rawLen     = 1 + posLen + macLen
	encodedLen = (rawLen*8 + 5) / 6
)

// Codec encodes and decodes cursors under one key. Its methods are safe for concurrent use.
type Codec struct {
	key []byte
}

// New returns a codec with key (at least 32 bytes of secret). A nil key makes a random one,
// good for one process only (tests).
func New(key []byte) *Codec {
	if key == nil {
		key = make([]byte, 32)
		rand.Read(key) //nolint:errcheck // never fails
	}
	return &Codec{key: append([]byte(nil), key...)}
}

// Binding joins the parts a cursor is bound to. Parts must not contain NUL.
func Binding(parts ...string) string { return strings.Join(parts, "\x00") }

// Encode returns the cursor of p under binding.
func (c *Codec) Encode(binding string, p Position) string {
	var raw [rawLen]byte
	raw[0] = version
	binary.BigEndian.PutUint64(raw[1:9], uint64(p.Time.UnixMicro())) //nolint:gosec // round-trips
	copy(raw[9:25], p.ID[:])
	copy(raw[1+posLen:], c.mac(binding, raw[:1+posLen]))
	return base64.RawURLEncoding.EncodeToString(raw[:])
}

// Decode checks s under binding and returns its position, or ErrInvalid.
func (c *Codec) Decode(binding, s string) (Position, error) {
	if len(s) != encodedLen {
		return Position{}, ErrInvalid
	}
	var raw [rawLen]byte
	n, err := base64.RawURLEncoding.Strict().Decode(raw[:], []byte(s))
	if err != nil || n != rawLen || raw[0] != version {
		return Position{}, ErrInvalid
	}
	if !hmac.Equal(raw[1+posLen:], c.mac(binding, raw[:1+posLen])) {
		return Position{}, ErrInvalid
	}
	var id uuid.UUID
	copy(id[:], raw[9:25])
	micros := int64(binary.BigEndian.Uint64(raw[1:9])) //nolint:gosec // round-trips
	return Position{Time: time.UnixMicro(micros).UTC(), ID: id}, nil
}

func (c *Codec) mac(binding string, msg []byte) []byte {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(binding))
	m.Write([]byte{0})
	m.Write(msg)
	return m.Sum(nil)[:macLen]
}
