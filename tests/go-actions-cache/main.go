// Command go-actions-cache drives BuildKit's cache client library,
// github.com/tonistiigi/go-actions-cache (what `docker buildx` uses for `type=gha`), against a
// cache server, configured from the environment exactly as BuildKit configures it
// (actionscache.TryEnv: ACTIONS_RUNTIME_TOKEN, ACTIONS_RESULTS_URL or ACTIONS_CACHE_URL,
// ACTIONS_CACHE_SERVICE_V2, ACTIONS_CACHE_API_FORCE_VERSION). tests/go_actions_cache.rs runs it.
//
//	go-actions-cache save KEY FILE   saves FILE's bytes under KEY
//	go-actions-cache load KEY FILE   restores KEY into FILE; exit status 3 on a miss
//	go-actions-cache azure-url URL   prints URL as the Azure SDK for Go rebuilds it
//	                                 (blob.ParseURL, then String), as azcopy does
//	go-actions-cache --version       prints the versions of the two libraries
package main

import (
	"context"
	"fmt"
	"os"
	"runtime/debug"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	actionscache "github.com/tonistiigi/go-actions-cache"
)

func main() {
	if len(os.Args) == 2 && os.Args[1] == "--version" {
		info, ok := debug.ReadBuildInfo()
		if !ok {
			fail(fmt.Errorf("no build information"))
		}
		for _, dep := range info.Deps {
			fmt.Println(dep.Path, dep.Version)
		}
		return
	}
	if len(os.Args) != 4 && !(len(os.Args) == 3 && os.Args[1] == "azure-url") {
		fail(fmt.Errorf("usage: %s save|load KEY FILE, or azure-url URL", os.Args[0]))
	}
	if os.Getenv("GO_ACTIONS_CACHE_DEBUG") != "" {
		actionscache.Log = func(format string, args ...interface{}) {
			fmt.Fprintf(os.Stderr, format+"\n", args...)
		}
	}
	ctx := context.Background()
	switch os.Args[1] {
	case "azure-url":
		parts, err := blob.ParseURL(os.Args[2])
		if err != nil {
			fail(err)
		}
		fmt.Println(parts.String())
	case "save":
		data, err := os.ReadFile(os.Args[3])
		if err != nil {
			fail(err)
		}
		if err := client().Save(ctx, os.Args[2], actionscache.NewBlob(data)); err != nil {
			fail(err)
		}
	case "load":
		entry, err := client().Load(ctx, os.Args[2])
		if err != nil {
			fail(err)
		}
		if entry == nil {
			fmt.Println("miss")
			os.Exit(3)
		}
		out, err := os.Create(os.Args[3])
		if err != nil {
			fail(err)
		}
		if err := entry.WriteTo(ctx, out); err != nil {
			fail(err)
		}
		if err := out.Close(); err != nil {
			fail(err)
		}
	default:
		fail(fmt.Errorf("unknown command %q", os.Args[1]))
	}
}

func client() *actionscache.Cache {
	c, err := actionscache.TryEnv(actionscache.Opt{})
	if err != nil {
		fail(err)
	}
	if c == nil {
		fail(fmt.Errorf("no ACTIONS_RUNTIME_TOKEN in the environment"))
	}
	return c
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "go-actions-cache: %+v\n", err)
	os.Exit(1)
}
