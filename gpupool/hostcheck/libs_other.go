//go:build !(cgo && unix)

package hostcheck

func findLibrary(name string) (string, string) {
	return "", "no dynamic loader lookup in this build (cgo off)"
}
