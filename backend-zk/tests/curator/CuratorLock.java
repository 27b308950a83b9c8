// One Apache Curator InterProcessMutex, driven line by line on stdin so the
// Rust interop test can interleave it with polylock clients.
//
//   args: CONNECT_STRING LOCK_PATH
//   stdin:  "acquire" (blocks in a thread; prints "ACQUIRED" when held)
//           "release" (prints "RELEASED")
//           "quit"
//   stdout: "READY" once connected.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.concurrent.Semaphore;

import org.apache.curator.framework.CuratorFramework;
import org.apache.curator.framework.CuratorFrameworkFactory;
import org.apache.curator.framework.recipes.locks.InterProcessMutex;
import org.apache.curator.retry.RetryOneTime;

public class CuratorLock {
    public static void main(String[] args) throws Exception {
        CuratorFramework client = CuratorFrameworkFactory.builder()
            .connectString(args[0])
            .sessionTimeoutMs(10000)
            .connectionTimeoutMs(10000)
            .retryPolicy(new RetryOneTime(100))
            .build();
        client.start();
        client.blockUntilConnected();
        InterProcessMutex mutex = new InterProcessMutex(client, args[1]);
        // A permit per "release" command: one sent before the worker waits
        // is not lost (as a notify would be).
        Semaphore releases = new Semaphore(0);
        say("READY");
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in));
        String line;
        while ((line = in.readLine()) != null) {
            switch (line.trim()) {
                case "acquire":
                    // The mutex is re-entrant per thread: acquire and release
                    // on one worker thread, the reader stays free.
                    new Thread(() -> {
                        try {
                            mutex.acquire();
                            say("ACQUIRED");
                            releases.acquire();
                            mutex.release();
                            say("RELEASED");
                        } catch (Exception e) {
                            say("ERROR " + e);
                        }
                    }).start();
                    break;
                case "release":
                    releases.release();
                    break;
                case "quit":
                    client.close();
                    return;
                default:
                    say("ERROR unknown command " + line);
            }
        }
        client.close();
    }

    private static synchronized void say(String s) {
        System.out.println(s);
        System.out.flush();
    }
}
