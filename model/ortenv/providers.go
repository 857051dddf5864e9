package ortenv

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdint.h>
#include <stdlib.h>

// ORT's C API is a table of function pointers that only ever grows at the
// end, so an entry's position is fixed for good: GetAvailableProviders is
// entry 125, ReleaseAvailableProviders 126, GetErrorMessage 2 and
// ReleaseStatus 93 (onnxruntime_c_api.h, OrtApi). Indexing the table keeps
// this probe free of ORT's 6,000-line header.
typedef struct {
	const void *(*GetApi)(uint32_t version);
	const char *(*GetVersionString)(void);
} scorer_ort_api_base;

typedef void *(*scorer_ort_get_providers)(char ***out, int *n);
typedef void *(*scorer_ort_release_providers)(char **p, int n);
typedef const char *(*scorer_ort_error_message)(const void *status);
typedef void (*scorer_ort_release_status)(void *status);

// scorer_ort_providers dlopens lib (a reference to an already loaded
// library when the process loaded it before), asks ORT API version api for
// its compiled-in execution providers and hands back a malloc'd copy of
// their names joined by '\n'. On failure it returns NULL and *err names the
// step.
static char *scorer_ort_providers(const char *lib, uint32_t api, const char **err, char **version) {
	void *h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
	if (!h) { *err = dlerror(); return NULL; }
	const scorer_ort_api_base *(*base)(void) = (const scorer_ort_api_base *(*)(void))dlsym(h, "OrtGetApiBase");
	if (!base) { *err = "no OrtGetApiBase symbol: not an ONNX Runtime library"; dlclose(h); return NULL; }
	const char *v = base()->GetVersionString();
	size_t vl = 0; while (v[vl]) vl++;
	*version = malloc(vl + 1);
	for (size_t i = 0; i <= vl; i++) (*version)[i] = v[i];
	void *const *t = (void *const *)base()->GetApi(api);
	if (!t) { *err = "the library does not offer the ORT API version this binary needs"; dlclose(h); return NULL; }
	char **names = NULL; int n = 0;
	void *st = ((scorer_ort_get_providers)t[125])(&names, &n);
	if (st) {
		*err = ((scorer_ort_error_message)t[2])(st);
		// The message lives in st; keep it by leaking st (one probe per run).
		dlclose(h);
		return NULL;
	}
	size_t total = 1;
	for (int i = 0; i < n; i++) { for (const char *c = names[i]; *c; c++) total++; total++; }
	char *out = malloc(total), *o = out;
	for (int i = 0; i < n; i++) {
		for (const char *c = names[i]; *c; c++) *o++ = *c;
		if (i < n - 1) *o++ = '\n';
	}
	*o = 0;
	((scorer_ort_release_providers)t[126])(names, n);
	dlclose(h);
	return out;
}
*/
import "C"

import (
	"fmt"
	"strings"
	"unsafe"
)

// ortAPIVersion is the C API version onnxruntime_go v1.35 asks for
// (ORT_API_VERSION in its header); a library older than ORT 1.29 lacks it.
const ortAPIVersion = 29

// RuntimeInfo is what an ONNX Runtime library says about itself.
type RuntimeInfo struct {
	// Version is the library's own version string, e.g. "1.29.0".
	Version string
	// Providers are the execution providers compiled into the library,
	// e.g. CUDAExecutionProvider and CPUExecutionProvider. A provider
	// listed here may still fail to load: CUDA's needs its provider
	// libraries beside the core and the CUDA runtime on the host.
	Providers []string
}

// HasProvider reports whether name is among the compiled-in providers.
func (r RuntimeInfo) HasProvider(name string) bool {
	for _, p := range r.Providers {
		if p == name {
			return true
		}
	}
	return false
}

// ProbeRuntime asks the ONNX Runtime library at libPath for its version and
// compiled-in execution providers through ORT's C API
// (GetAvailableProviders), which onnxruntime_go does not wrap. It is how
// the packaging test and `scorer doctor` tell a CUDA-capable build from a
// CPU-only one before any session exists. It works with or without
// InitRuntime: a library already loaded is only referenced again.
func ProbeRuntime(libPath string) (RuntimeInfo, error) {
	if libPath == "" {
		return RuntimeInfo{}, fmt.Errorf("ortenv: probing ONNX Runtime: library path is empty")
	}
	cpath := C.CString(libPath)
	defer C.free(unsafe.Pointer(cpath))
	var cerr *C.char
	var cver *C.char
	out := C.scorer_ort_providers(cpath, C.uint32_t(ortAPIVersion), &cerr, &cver)
	var info RuntimeInfo
	if cver != nil {
		info.Version = C.GoString(cver)
		C.free(unsafe.Pointer(cver))
	}
	if out == nil {
		msg := "unknown error"
		if cerr != nil {
			msg = C.GoString(cerr)
		}
		return info, fmt.Errorf("ortenv: probing ONNX Runtime %s: %s", libPath, msg)
	}
	defer C.free(unsafe.Pointer(out))
	if s := C.GoString(out); s != "" {
		info.Providers = strings.Split(s, "\n")
	}
	return info, nil
}
