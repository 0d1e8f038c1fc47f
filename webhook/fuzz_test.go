package webhook

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	configv1alpha1 "github.com/gputopo/gputopo/api/config/v1alpha1"
	"github.com/gputopo/gputopo/api/v1alpha1"
)

func reviewBody(t testing.TB, req admission.Request) []byte {
	t.Helper()
	return mustJSON(t, admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request:  &req.AdmissionRequest,
	})
}

// FuzzHandler sends arbitrary AdmissionReview bodies through the HTTP
// path the apiserver uses, to each handler (the first byte picks one), with
// panic recovery off so a panic fails the fuzzer. Properties: the response
// UID echoes the request's, and the patch, if any, applies and gives the
// same object applied twice as once.
func FuzzHandler(f *testing.F) {
	seeds := []admission.Request{
		podCreate(f, MakePod("p", nsOptedIn).GPU(4).Intent("model").Container("logger", 0).Env("logger", envVar(v1alpha1.EnvVisibleDevices, "all")).Obj(), userAlice),
		podCreate(f, MakePod("", nsOptedIn).GenerateName("train-").GPU(2).OwnedByJob("train").Obj(), userAlice),
		podCreate(f, MakePod("p", nsOptedIn).GPU(1).Annotation(v1alpha1.AnnotationAssignedGPUs, uuidA).Requirement(`{"strategy":"x"}`).Obj(), userAlice),
		request(f, admissionv1.Update, "pods", "ephemeralcontainers", MakePod("p", nsOptedIn).Ephemeral("d").Obj(), MakePod("p", nsOptedIn).Obj(), userAlice),
		request(f, admissionv1.Create, "jobs", "", MakeJob("train", nsOptedIn, 4).Intent("model").Obj(), nil, userAlice),
		request(f, admissionv1.Create, "jobs", "", MakeJob("train.v2", nsOptedIn, 4).Intent("model").Parallelism(4).Annotation(v1alpha1.AnnotationGroupSize, "2").Obj(), nil, userAlice),
		request(f, admissionv1.Update, "pods", "", MakePod("p", nsOptedIn).GPU(4).Group("llm", "4").Obj(), MakePod("p", nsOptedIn).GPU(4).Group("llm", "2").Obj(), userAlice),
	}
	for _, s := range seeds {
		for h := range 3 {
			f.Add(byte(h), reviewBody(f, s))
		}
	}
	f.Add(byte(0), []byte(`{"request":{"uid":"u","operation":"CREATE","namespace":"team-a","object":{"spec":{"containers":[{"resources":{"limits":{"nvidia.com/gpu":"1"}}}]}}}}`))
	f.Add(byte(2), []byte(`{"request":{"uid":"u","operation":"CREATE","namespace":"team-a","object":{"metadata":{"annotations":{"gputopo.io/parallelism":"model"}},"spec":{"template":{}}}}}`))

	cfg := configv1alpha1.DefaultWebhookConfiguration()
	reader := fakeReader(f, MakeJob("train", nsOptedIn, 4).Intent("model").Obj())
	handlers := []*admission.Webhook{
		{Handler: NewPodMutator(cfg, reader)},
		{Handler: NewPodValidator(cfg, reader)},
		{Handler: NewJobMutator(cfg, reader)},
	}
	for _, h := range handlers {
		h.WithRecoverPanic(false)
	}

	f.Fuzz(func(t *testing.T, which byte, body []byte) {
		h := handlers[int(which)%len(handlers)]
		r := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)

		var out admissionv1.AdmissionReview
		if err := json.Unmarshal(w.Body.Bytes(), &out); err != nil || out.Response == nil {
			t.Fatalf("response is not an AdmissionReview: %v: %s", err, w.Body.Bytes())
		}
		var in admissionv1.AdmissionReview
		if err := kjson.UnmarshalCaseSensitivePreserveInts(body, &in); err != nil || in.Request == nil {
			return // not a review: the error response is all there is to check
		}
		if out.Response.Result != nil && out.Response.Result.Code == http.StatusBadRequest && out.Response.UID == "" {
			return // the webhook's decoder refused what encoding/json accepted
		}
		if out.Response.UID != in.Request.UID {
			t.Fatalf("response UID %q, request UID %q", out.Response.UID, in.Request.UID)
		}
		if len(out.Response.Patch) == 0 {
			return
		}
		if !out.Response.Allowed {
			t.Fatalf("a denial carries a patch: %s", out.Response.Patch)
		}
		patch, err := jsonpatch.DecodePatch(out.Response.Patch)
		if err != nil {
			t.Fatalf("undecodable patch %s: %v", out.Response.Patch, err)
		}
		once, err := patch.Apply(in.Request.Object.Raw)
		if err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", out.Response.Patch, in.Request.Object.Raw, err)
		}
		twice, err := patch.Apply(once)
		if err != nil {
			t.Fatalf("patch %s does not apply twice: %v", out.Response.Patch, err)
		}
		var a, b any
		if err := json.Unmarshal(once, &a); err != nil {
			t.Fatalf("patched object is not JSON: %v", err)
		}
		if err := json.Unmarshal(twice, &b); err != nil {
			t.Fatalf("twice-patched object is not JSON: %v", err)
		}
		if diff := cmp.Diff(a, b); diff != "" {
			t.Fatalf("patch applied twice differs from once (-once +twice):\n%s", diff)
		}
	})
}
