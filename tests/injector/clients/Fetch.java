// java Fetch.java URL FILE: one GET with the JDK's own HttpClient, as Java data loaders do.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.file.Path;

public class Fetch {
    public static void main(String[] args) throws Exception {
        HttpClient client = HttpClient.newHttpClient();
        HttpRequest request = HttpRequest.newBuilder(URI.create(args[0])).build();
        HttpResponse<Path> response =
                client.send(request, HttpResponse.BodyHandlers.ofFile(Path.of(args[1])));
        if (response.statusCode() != 200) {
            System.err.println("status " + response.statusCode());
            System.exit(1);
        }
    }
}
