//go:build cgo && unix

package ortenv

/*
#cgo LDFLAGS: -ldl
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdlib.h>
#include <string.h>

// ortenv_find_lib loads name as the dynamic loader would for a library
// that asks for it by soname (LD_LIBRARY_PATH, the ld.so cache, the default
// directories), and returns a malloc'd copy of the path it was loaded
// from, or NULL with *err set. The reference is dropped again; a library
// the process had loaded before stays loaded.
static char *ortenv_find_lib(const char *name, char **err) {
	void *h = dlopen(name, RTLD_LAZY | RTLD_LOCAL);
	if (!h) { const char *e = dlerror(); *err = strdup(e ? e : "dlopen failed"); return NULL; }
	struct link_map *lm = NULL;
	char *out = NULL;
	if (dlinfo(h, RTLD_DI_LINKMAP, &lm) == 0 && lm && lm->l_name && lm->l_name[0]) {
		out = strdup(lm->l_name);
	} else {
		*err = strdup("loaded, but the loader does not say from where");
	}
	dlclose(h);
	return out;
}
*/
import "C"

import "unsafe"

// findLibrary is FindLibrary's loader lookup.
func findLibrary(name string) (string, string) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr *C.char
	p := C.ortenv_find_lib(cname, &cerr)
	if p == nil {
		msg := C.GoString(cerr)
		C.free(unsafe.Pointer(cerr))
		return "", msg
	}
	defer C.free(unsafe.Pointer(p))
	return C.GoString(p), ""
}
