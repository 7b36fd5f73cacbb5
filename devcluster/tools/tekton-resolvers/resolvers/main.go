/*
Copyright 2022 The Tekton Authors

Licensed under the Apache License, Version 2.0 (the "License");
you may not use this file except in compliance with the License.
You may obtain a copy of the License at

    http://www.apache.org/licenses/LICENSE-2.0

Unless required by applicable law or agreed to in writing, software
distributed under the License is distributed on an "AS IS" BASIS,
WITHOUT WARRANTIES OR CONDITIONS OF ANY KIND, either express or implied.
See the License for the specific language governing permissions and
limitations under the License.
*/

// Tekton Pipelines' resolvers controller (github.com/tektoncd/pipeline/cmd/resolvers at the version
// pinned in ../go.mod), copied for egress-placer's devcluster with changes so that several clusters
// can run on one machine and nothing listens beyond loopback:
//   - knative's probe server on the fixed ":8080" is disabled (sharedmain.WithHealthProbesDisabled);
//     a readiness/health server binds PROBES_ADDRESS (default 127.0.0.1:8080) instead;
//   - -disable-ha, as the controller has.
//
// The resolvers (git, hub, bundles, cluster, http) are Tekton's own.
package main

import (
	"flag"
	"log"
	"net"
	nethttp "net/http"
	"os"
	"strconv"
	"strings"

	"github.com/tektoncd/pipeline/pkg/apis/resolution/v1alpha1"
	"github.com/tektoncd/pipeline/pkg/remoteresolution/resolver/bundle"
	"github.com/tektoncd/pipeline/pkg/remoteresolution/resolver/cluster"
	"github.com/tektoncd/pipeline/pkg/remoteresolution/resolver/framework"
	"github.com/tektoncd/pipeline/pkg/remoteresolution/resolver/git"
	"github.com/tektoncd/pipeline/pkg/remoteresolution/resolver/http"
	"github.com/tektoncd/pipeline/pkg/remoteresolution/resolver/hub"
	hubresolution "github.com/tektoncd/pipeline/pkg/resolution/resolver/hub"
	"k8s.io/client-go/rest"
	filteredinformerfactory "knative.dev/pkg/client/injection/kube/informers/factory/filtered"
	"knative.dev/pkg/controller"
	"knative.dev/pkg/injection"
	"knative.dev/pkg/injection/sharedmain"
	"knative.dev/pkg/signals"
)

func main() {
	if val, ok := os.LookupEnv("THREADS_PER_CONTROLLER"); ok {
		threadsPerController, err := strconv.Atoi(val)
		if err != nil {
			log.Fatalf("failed to parse value %q of THREADS_PER_CONTROLLER: %v\n", val, err)
		}
		controller.DefaultThreadsPerController = threadsPerController
	}
	flag.IntVar(&controller.DefaultThreadsPerController, "threads-per-controller", controller.DefaultThreadsPerController, "Threads (goroutines) to create per controller")
	disableHighAvailability := flag.Bool("disable-ha", false, "Whether to disable high-availability functionality for this component.")

	ctx := filteredinformerfactory.WithSelectors(signals.NewContext(), v1alpha1.ManagedByLabelKey)
	tektonHubURL := buildHubURL(os.Getenv("TEKTON_HUB_API"), "")
	artifactHubURL := buildHubURL(os.Getenv("ARTIFACT_HUB_API"), hubresolution.DefaultArtifactHubURL)

	// This parses flags.
	cfg := injection.ParseAndGetRESTConfigOrDie()

	if cfg.QPS == 0 {
		cfg.QPS = 2 * rest.DefaultQPS
	}
	if cfg.Burst == 0 {
		cfg.Burst = rest.DefaultBurst
	}
	// multiply by no of controllers being created
	cfg.QPS = 5 * cfg.QPS
	cfg.Burst = 5 * cfg.Burst

	if *disableHighAvailability {
		ctx = sharedmain.WithHADisabled(ctx)
	}

	address := os.Getenv("PROBES_ADDRESS")
	if address == "" {
		address = net.JoinHostPort("127.0.0.1", "8080")
	}
	mux := nethttp.NewServeMux()
	mux.HandleFunc("/", handler)
	mux.HandleFunc("/health", handler)
	mux.HandleFunc("/readiness", handler)
	go func() {
		log.Printf("Readiness and health check server listening on %s", address)
		log.Fatal(nethttp.ListenAndServe(address, mux)) // #nosec G114 -- see https://github.com/securego/gosec#available-rules
	}()
	ctx = sharedmain.WithHealthProbesDisabled(ctx)

	sharedmain.MainWithConfig(ctx, "controller", cfg,
		framework.NewController(ctx, &git.Resolver{}),
		framework.NewController(ctx, &hub.Resolver{TektonHubURL: tektonHubURL, ArtifactHubURL: artifactHubURL}),
		framework.NewController(ctx, &bundle.Resolver{}),
		framework.NewController(ctx, &cluster.Resolver{}),
		framework.NewController(ctx, &http.Resolver{}))
}

func buildHubURL(configAPI, defaultURL string) string {
	var hubURL string
	if configAPI == "" {
		hubURL = defaultURL
	} else {
		hubURL = configAPI
	}
	return strings.TrimSuffix(hubURL, "/")
}

func handler(w nethttp.ResponseWriter, r *nethttp.Request) {
	w.WriteHeader(nethttp.StatusOK)
}
