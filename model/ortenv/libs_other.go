//go:build !(cgo && unix)

package ortenv

func findLibrary(name string) (string, string) {
	return "", "no dynamic loader lookup in this build (cgo off)"
}
