// Command floor-webhook is the cheapest a mutating admission webhook can be: Go's net/http and
// encoding/json, answering every AdmissionReview "allowed" with no patch. The benchmarks register it
// on exactly egress-placer's hooks (same rules, matchConditions, failurePolicy and timeouts, a
// caBundle and a URL on loopback) so that egress-placer's end-to-end cost can be read against the
// cost of merely being a webhook (bench/e2e.py, `e2e.floor_ratio`).
//
// On a path ending in /patch it answers "allowed" with a JSON Patch that changes nothing (one `test`
// operation on the object's kind): the cheapest webhook that mutates. The API server applies any
// patch it gets (it encodes the object, applies the patch, decodes and defaults the result) inside the
// call it times, and skips all that for an answer with none (bench/e2e.py, `e2e.call_latency_patch_floor`).
//
//	floor-webhook --listen 127.0.0.1:PORT --cert tls.crt --key tls.key
//
// It serves POST /mutate and POST /mutate/patch (any other path answers as /mutate) and GET /healthz,
// and stops on SIGTERM.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"
)

const maxReviewBytes = 8 << 20

type review struct {
	APIVersion string          `json:"apiVersion"`
	Kind       string          `json:"kind"`
	Request    *reviewRequest  `json:"request,omitempty"`
	Response   *reviewResponse `json:"response,omitempty"`
}

type reviewRequest struct {
	UID  string `json:"uid"`
	Kind struct {
		Kind string `json:"kind"`
	} `json:"kind"`
}

type reviewResponse struct {
	UID       string `json:"uid"`
	Allowed   bool   `json:"allowed"`
	PatchType string `json:"patchType,omitempty"`
	Patch     []byte `json:"patch,omitempty"`
}

type testOperation struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value string `json:"value"`
}

func mutate(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	var in review
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxReviewBytes)).Decode(&in); err != nil || in.Request == nil {
		http.Error(w, "not an AdmissionReview", http.StatusBadRequest)
		return
	}
	out := review{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview",
		Response: &reviewResponse{UID: in.Request.UID, Allowed: true}}
	if strings.HasSuffix(r.URL.Path, "/patch") {
		patch, err := json.Marshal([]testOperation{{Op: "test", Path: "/kind", Value: in.Request.Kind.Kind}})
		if err != nil {
			http.Error(w, "making the patch", http.StatusInternalServerError)
			return
		}
		out.Response.PatchType, out.Response.Patch = "JSONPatch", patch
	}
	w.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(w).Encode(out); err != nil {
		log.Printf("writing the answer: %v", err)
	}
}

func main() {
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on (loopback)")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its private key (PEM)")
	flag.Parse()
	if *cert == "" || *key == "" {
		fmt.Fprintln(os.Stderr, "--cert and --key are required")
		os.Exit(2)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/", mutate)
	server := &http.Server{Addr: *listen, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = server.Shutdown(ctx)
	}()
	log.Printf("serving on https://%s", *listen)
	if err := server.ListenAndServeTLS(*cert, *key); err != nil && err != http.ErrServerClosed {
		log.Fatal(err)
	}
}
