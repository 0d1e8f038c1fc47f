package webhook

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
)

// The patches this package emits only ever set a value at a path: "add" on
// an object member (which replaces an existing one) or "replace" on an
// array element, never "remove" and never an insert into an array. Applying
// such a patch twice therefore gives the same object as applying it once,
// which is what the apiserver's reinvocation of mutating webhooks needs.

// escapePointer escapes one JSON-pointer reference token (RFC 6901).
func escapePointer(s string) string {
	if !strings.ContainsAny(s, "~/") {
		return s
	}
	return strings.ReplaceAll(strings.ReplaceAll(s, "~", "~0"), "/", "~1")
}

func opSet(path string, value any) jsonpatch.JsonPatchOperation {
	return jsonpatch.JsonPatchOperation{Operation: "add", Path: path, Value: value}
}

func opReplace(path string, value any) jsonpatch.JsonPatchOperation {
	return jsonpatch.JsonPatchOperation{Operation: "replace", Path: path, Value: value}
}

// setMapEntries sets keys of the string map at mapPath (e.g.
// "/metadata/annotations"). exists says whether the map is present and
// not null; when it is not, the whole map is written in one operation.
func setMapEntries(ops []jsonpatch.JsonPatchOperation, mapPath string, exists bool, set map[string]string) []jsonpatch.JsonPatchOperation {
	if len(set) == 0 {
		return ops
	}
	if !exists {
		return append(ops, opSet(mapPath, set))
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		ops = append(ops, opSet(mapPath+"/"+escapePointer(k), set[k]))
	}
	return ops
}

// metadataShape records which parts of an object's metadata are present in
// the raw JSON, so patches never address a member whose parent is missing.
type metadataShape struct {
	present     bool
	annotations bool
	labels      bool
}

// rawShape says whether a raw JSON member is present and not null.
func rawPresent(m json.RawMessage) bool {
	return len(m) > 0 && string(m) != "null"
}

// setMetadata emits the operations that set annotations and labels under
// the metadata object at path.
func setMetadata(ops []jsonpatch.JsonPatchOperation, path string, shape metadataShape, annotations, labels map[string]string) []jsonpatch.JsonPatchOperation {
	if len(annotations) == 0 && len(labels) == 0 {
		return ops
	}
	if !shape.present {
		meta := map[string]map[string]string{}
		if len(annotations) > 0 {
			meta["annotations"] = annotations
		}
		if len(labels) > 0 {
			meta["labels"] = labels
		}
		return append(ops, opSet(path, meta))
	}
	ops = setMapEntries(ops, path+"/annotations", shape.annotations, annotations)
	return setMapEntries(ops, path+"/labels", shape.labels, labels)
}

func indexPath(base string, i int) string {
	return base + "/" + strconv.Itoa(i)
}
