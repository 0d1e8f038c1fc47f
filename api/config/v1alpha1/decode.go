package v1alpha1

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	sigsjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Decode strictly decodes data, a YAML or JSON file holding one
// configuration, into obj (a pointer to one of this package's
// configurations), over what obj already holds: fields the file leaves out
// keep their values. It neither defaults nor validates (the Parse functions
// do).
//
// The rules, the same for every component's file:
//   - the file holds one document: a second one is refused, naming its
//     number; `---` separators around the one document and comment-only
//     documents are fine; an empty file changes nothing;
//   - a key written twice in a mapping is refused;
//   - field names are case-sensitive, and an unknown field is refused by
//     its full path (weights.utilisation);
//   - a duration (metav1.Duration, at any depth) needs a unit ("90s",
//     "15m"), except 0: a bare 0 reads as "0s", any other bare number is
//     refused with a hint.
//
// Field errors (unknown fields, durations without a unit) are all reported
// at once; a file that is not YAML stops at the first error.
func Decode(data []byte, obj any) error {
	errs, err := decode(data, obj)
	if err != nil {
		return err
	}
	return utilerrors.NewAggregate(errs)
}

// decode is Decode, with the field errors apart so that they can be
// reported together with the validation's.
func decode(data []byte, obj any) ([]error, error) {
	kind := kindOf(obj)
	doc, err := singleDocument(data, kind)
	if err != nil || doc == nil {
		return nil, err
	}
	doc, numErrs, err := unitlessDurations(doc, reflect.TypeOf(obj), nil)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", kind, err)
	}
	strict, err := sigsjson.UnmarshalStrict(doc, obj)
	if err != nil {
		return nil, fmt.Errorf("decode %s: %w", kind, err)
	}
	errs := make([]error, 0, len(numErrs)+len(strict))
	for _, e := range numErrs {
		errs = append(errs, e)
	}
	return append(errs, strict...), nil
}

// validator is a configuration that validates itself.
type validator interface {
	Validate() field.ErrorList
}

// parse decodes data into obj, defaults it (setDefaults, when not nil) and
// validates it, reporting the decoding's field errors and every invalid
// value at once.
func parse(data []byte, obj validator, setDefaults func()) error {
	errs, err := decode(data, obj)
	if err != nil {
		return err
	}
	if setDefaults != nil {
		setDefaults()
	}
	for _, e := range obj.Validate() {
		errs = append(errs, e)
	}
	if len(errs) > 0 {
		return fmt.Errorf("invalid %s: %w", kindOf(obj), utilerrors.NewAggregate(errs))
	}
	return nil
}

// load reads the file at path and parses it; errors name the component and
// the file.
func load[T any](path, component string, parse func([]byte) (T, error)) (T, error) {
	var zero T
	b, err := os.ReadFile(path)
	if err != nil {
		return zero, fmt.Errorf("read %s config: %w", component, err)
	}
	c, err := parse(b)
	if err != nil {
		return zero, fmt.Errorf("%s config %s: %w", component, path, err)
	}
	return c, nil
}

// kindOf is the kind obj decodes: its type's name, which for this
// package's configurations is their kind.
func kindOf(obj any) string {
	t := reflect.TypeOf(obj)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Name() == "" {
		return "configuration"
	}
	return t.Name()
}

// validateTypeMeta checks an apiVersion and kind that may be omitted but,
// when written, must be these: a file written for another component or
// another version is refused rather than misread.
func validateTypeMeta(tm metav1.TypeMeta, apiVersion, kind string) field.ErrorList {
	var errs field.ErrorList
	if tm.APIVersion != "" && tm.APIVersion != apiVersion {
		errs = append(errs, field.NotSupported(field.NewPath("apiVersion"), tm.APIVersion, []string{apiVersion}))
	}
	if tm.Kind != "" && tm.Kind != kind {
		errs = append(errs, field.NotSupported(field.NewPath("kind"), tm.Kind, []string{kind}))
	}
	return errs
}

// singleDocument returns the file's one YAML (or JSON) document as JSON,
// nil for an empty file. A second document is refused, naming its number:
// a component reads one configuration, and silently ignoring the rest of a
// file (a `---` left in by an editor or a kustomize patch) would apply a
// configuration nobody reviewed. Keys written twice are refused.
func singleDocument(data []byte, kind string) ([]byte, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	var doc []byte
	for n := 0; ; {
		chunk, err := r.Read()
		if errors.Is(err, io.EOF) {
			return doc, nil
		}
		if err != nil {
			return nil, fmt.Errorf("read %s document: %w", kind, err)
		}
		j, err := yaml.YAMLToJSONStrict(chunk)
		if err != nil {
			return nil, fmt.Errorf("decode %s document %d: %w", kind, n+1, err)
		}
		if bytes.Equal(bytes.TrimSpace(j), []byte("null")) {
			continue // only comments or blank lines
		}
		n++
		if n > 1 {
			return nil, fmt.Errorf("document %d: the file must hold one %s, not a multi-document YAML stream; remove the other documents or the --- separator", n, kind)
		}
		doc = j
	}
}

var (
	durationType    = reflect.TypeFor[metav1.Duration]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// unitlessDurations rewrites a bare 0 written for a duration of t (a
// struct, or a pointer to one, decoded from doc; path is where doc stands)
// as "0s", and reports other bare numbers there: 0 needs no unit
// ("topologyMaxAge: 0" turns the age check off), any other number is
// refused with a hint instead of a JSON type error. What is not an object
// where t has a struct is left for the strict decode to name.
func unitlessDurations(doc []byte, t reflect.Type, path *field.Path) ([]byte, field.ErrorList, error) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	var obj map[string]json.RawMessage
	if t.Kind() != reflect.Struct || json.Unmarshal(doc, &obj) != nil {
		return doc, nil, nil
	}
	errs, changed, err := durationsIn(obj, t, path)
	if err != nil || !changed {
		return doc, errs, err
	}
	out, err := json.Marshal(obj)
	return out, errs, err
}

// durationsIn applies unitlessDurations to the fields of struct t in obj,
// reporting whether it changed obj.
func durationsIn(obj map[string]json.RawMessage, t reflect.Type, path *field.Path) (field.ErrorList, bool, error) {
	var errs field.ErrorList
	changed := false
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		ft := f.Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch {
		case name == "-" || !f.IsExported():
			continue
		case name == "" && f.Anonymous && ft.Kind() == reflect.Struct:
			// An embedded (inline) struct: its fields are this object's.
			e, c, err := durationsIn(obj, ft, path)
			if err != nil {
				return nil, false, err
			}
			errs, changed = append(errs, e...), changed || c
			continue
		case name == "":
			name = f.Name
		}
		raw, ok := obj[name]
		if !ok {
			continue
		}
		fp := field.NewPath(name)
		if path != nil {
			fp = path.Child(name)
		}
		switch {
		case ft == durationType:
			if len(raw) == 0 || (raw[0] != '-' && (raw[0] < '0' || raw[0] > '9')) {
				continue
			}
			var v float64
			if err := json.Unmarshal(raw, &v); err != nil {
				return nil, false, fmt.Errorf("%s: %w", fp, err)
			}
			if v == 0 {
				obj[name], changed = json.RawMessage(`"0s"`), true
				continue
			}
			errs = append(errs, field.Invalid(fp, string(raw), "a duration needs a unit, e.g. 15m, 90s or 2m30s (only 0 may be written without one)"))
			delete(obj, name)
			changed = true
		case ft.Kind() == reflect.Struct && !reflect.PointerTo(ft).Implements(unmarshalerType):
			out, e, err := unitlessDurations(raw, ft, fp)
			if err != nil {
				return nil, false, err
			}
			errs = append(errs, e...)
			if !bytes.Equal(out, raw) {
				obj[name], changed = out, true
			}
		}
	}
	return errs, changed, nil
}
