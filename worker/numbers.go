package worker

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"

	"github.com/invopop/jsonschema"
)

// JSON Schema's "integer" is any whole number, 2.0 and 1e3 included, so the coordinator
// accepts them for a field HandleJSON declared from a Go integer; encoding/json refuses
// them for that field, and the job would fail at run time. HandleJSON decodes them
// (decodeWhole), and declares each sized or unsigned integer with its range
// (integerRange), so a number the field cannot hold is refused at submission.

// decodeWhole decodes payload into args as encoding/json does, after writing every
// whole number with a fraction or an exponent (2.0, 1e3) as an integer. It is what
// HandleJSON tries when json.Unmarshal refused a number.
func decodeWhole(payload []byte, args any) error {
	d := json.NewDecoder(bytes.NewReader(payload))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return err
	}
	b, err := json.Marshal(wholeNumbers(v))
	if err != nil {
		return err
	}
	return json.Unmarshal(b, args)
}

// refusedNumber reports whether err is encoding/json refusing a number for its field.
func refusedNumber(err error) bool {
	var te *json.UnmarshalTypeError
	return errors.As(err, &te) && strings.HasPrefix(te.Value, "number")
}

// wholeNumbers rewrites, in place, the whole numbers of v written with a fraction or an
// exponent as integers. An exponent beyond ±20 is left alone: no Go integer holds it,
// and its digits would cost memory.
func wholeNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = wholeNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = wholeNumbers(e)
		}
	case json.Number:
		s := string(x)
		if !strings.ContainsAny(s, ".eE") || !smallExponent(s) {
			return x
		}
		if r, ok := new(big.Rat).SetString(s); ok && r.IsInt() {
			return json.Number(r.Num().String())
		}
	}
	return v
}

func smallExponent(s string) bool {
	i := strings.IndexAny(s, "eE")
	if i < 0 {
		return true
	}
	e, err := strconv.Atoi(s[i+1:])
	return err == nil && e >= -20 && e <= 20
}

// integerRange is the schema of a sized or unsigned Go integer: an integer in its
// range. int and int64 keep the plain "integer" (their range is JSON's in practice);
// a type that decodes itself (json.Unmarshaler) is left to the reflector.
func integerRange(t reflect.Type) *jsonschema.Schema {
	un := reflect.TypeFor[json.Unmarshaler]()
	if t.Implements(un) || reflect.PointerTo(t).Implements(un) {
		return nil
	}
	var lo, hi int64
	var uhi uint64
	switch t.Kind() {
	case reflect.Int8:
		lo, hi = math.MinInt8, math.MaxInt8
	case reflect.Int16:
		lo, hi = math.MinInt16, math.MaxInt16
	case reflect.Int32:
		lo, hi = math.MinInt32, math.MaxInt32
	case reflect.Uint8:
		uhi = math.MaxUint8
	case reflect.Uint16:
		uhi = math.MaxUint16
	case reflect.Uint32:
		uhi = math.MaxUint32
	case reflect.Uint, reflect.Uint64, reflect.Uintptr:
		uhi = math.MaxUint64
	default:
		return nil
	}
	if uhi != 0 {
		return &jsonschema.Schema{Type: "integer", Minimum: "0", Maximum: json.Number(strconv.FormatUint(uhi, 10))}
	}
	return &jsonschema.Schema{Type: "integer", Minimum: json.Number(strconv.FormatInt(lo, 10)), Maximum: json.Number(strconv.FormatInt(hi, 10))}
}
